# devgate: erase (not upgrade, where $1 is 1) removes the runtime wrapper's link.
if [ "$1" = 0 ]; then
    rm -f /usr/bin/devgate-runtime
fi

# devgate: erase (not upgrade, where $1 is 1). /usr/bin/devgate-runtime was once a link
# the install scriptlet made; it is a file of the package now, and this removes a link an
# earlier package left.
if [ "$1" = 0 ] && [ -L /usr/bin/devgate-runtime ]; then
    rm -f /usr/bin/devgate-runtime
fi

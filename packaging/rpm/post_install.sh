# devgate: the quarantine ledger and the decision log; root's, mode 0755.
install -d -m 0755 /var/lib/devgate /var/lib/devgate/quarantine /var/lib/devgate/log

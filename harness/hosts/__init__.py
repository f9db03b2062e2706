"""Where cells run, as seen from the controller: the Host interface and the local host (local),
SSH hosts (ssh), the hosts.yaml inventory, the code bundle shipped to a remote host, and
`harness hosts check`. Never imports torch or worker code."""

"""`stoker lab`: an emulated cluster on one machine (namespaces, veths, a bridge, CPU quotas)."""

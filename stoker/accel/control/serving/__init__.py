"""The dispatcher's control server and its parts: the control socket and the request routing the
dispatcher and the fleet both serve through, the handlers (a worker's messages, a rank's), and the I/O-free
books they keep (connections, host-id ownership, last heard, the ranks' needs, the stall reporter)."""

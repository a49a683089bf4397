"""The control plane: the dispatcher that leases work units (`dispatcher`), its fsync'd journal
(`journal`), the control socket that serves it (`server`), the standalone `stoker dispatch`
service (`service`) and the client a consumer rank uses to reach a dispatcher elsewhere
(`remote`). Nothing here steps a model; the consumer imports this package, not the reverse."""

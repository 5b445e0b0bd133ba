"""The Textual app for ``mlxspec chat`` and ``mlxspec sweep --tui``: widgets render engine
events; generation runs in a worker; widgets never call models. (Built by the chat/sweep issue.)"""

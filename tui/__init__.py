"""The Textual app for ``mlxspec chat`` (and, later, ``mlxspec sweep --tui``).

Widgets render engine events; generation runs in one worker thread that owns all MLX state and
posts one message per verification step; widgets never call models. Entry point:
``tui.app.run_chat`` (``python -m tui`` for the same without the CLI).

Modules: ``app`` (ChatApp, the worker, run_chat), ``widgets`` and ``stream`` (what is drawn),
``messages`` (worker -> UI payloads), ``stats`` (live statistics), ``source`` (the model side,
injectable), ``fake`` (a scripted source for tests and ``--demo``), ``overhead`` (TUI vs headless
tokens/s), ``screenshot`` (docs/chat.png).
"""

"""The Textual apps behind ``mlxspec chat`` and ``mlxspec sweep --tui``.

Widgets render engine events; generation runs in one worker thread that owns all MLX state and
posts one message per verification step; widgets never call models. Entry points:
``mlxspec.tui.chat.app.run_chat`` (``python -m mlxspec.tui`` for the same without the CLI) and
``mlxspec.tui.sweep.app.run_sweep_tui``.

Modules: ``app`` (ChatApp, the worker, run_chat), ``sweep_app`` (the live K sweep), ``widgets``
and ``stream`` (what is drawn), ``messages`` (worker -> UI payloads), ``stats`` (live
statistics), ``source`` (the model side, injectable), ``fake`` (a scripted source for tests and
``--demo``), ``threads`` (exiting safely after MLX ran on a worker), ``overhead`` (TUI vs
headless tokens/s), ``screenshot`` (docs/chat.png).
"""

"""The one exception type the CLI turns into a one-line message instead of a traceback."""


class MlxspecError(Exception):
    """A problem the user can fix: bad input, a missing model, an incompatible pair."""


class UnsupportedArchitecture(MlxspecError):
    """A model type our own llama module does not implement; ``loading.load`` then tries
    mlx-lm's own model class for it."""

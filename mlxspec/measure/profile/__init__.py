"""``mlxspec profile``: where one speculative step's time goes. The drafter proposes K tokens,
the target runs one pass over the last committed token and the K drafts, the acceptance rule
decides, and the host reads back, rolls the caches back and tells the drafter; each part is
timed apart (``stepper``), beside the target pass over L = 1..K+1 tokens, the engine's own step
time and, with ``--compare``, every forward path of the model (``paths``). ``profile_step``
takes a ``ProfileOptions`` record and returns a ``StepProfile`` (``records``); ``render``
draws it.
"""

from mlxspec.measure.profile.paths import PATHS, compare_paths
from mlxspec.measure.profile.records import PHASES, ProfileOptions, StepProfile
from mlxspec.measure.profile.render import print_profile
from mlxspec.measure.profile.run import COMPARE_ON_TORCH, profile_step, profiled_draft
from mlxspec.measure.profile.stepper import sync_round_trip_ms

__all__ = ["COMPARE_ON_TORCH", "PATHS", "PHASES", "ProfileOptions", "StepProfile", "compare_paths",
           "print_profile", "profile_step", "profiled_draft", "sync_round_trip_ms"]

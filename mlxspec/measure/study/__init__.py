"""``mlxspec study``: when are drafts accepted, by domain, by depth in the draft tree, and
against the target's uncertainty, as the published study of tree acceptance measured it.

Four domains' prompts (``prompts``) decoded with tree speculation, every verified node logged
(``log``), then pure figures of the node records (``stats``, ``figures``, ``variance``), the
paper's claims beside ours (``claims``), one entry point taking a ``StudyOptions`` record and
returning a ``StudyResult`` (``run``), and the tables and plots (``render``).
"""

from mlxspec.measure.study.claims import PAPER, SIGNIFICANT, Claim, Paper, paper_claims
from mlxspec.measure.study.figures import alpha, depth_rows, domain_rows, entropy_bins
from mlxspec.measure.study.log import StudyLog, StudySettings, prompt_records, read_log, run_prompts
from mlxspec.measure.study.prompts import DOMAINS, distilled_on, study_prompts
from mlxspec.measure.study.render import log_line, plot_study, print_study
from mlxspec.measure.study.run import StudyOptions, StudyResult, run_study, summarise
from mlxspec.measure.study.stats import spearman_estimate, weighted_spearman
from mlxspec.measure.study.variance import domain_vs_depth, logistic_deviance

__all__ = [
    "DOMAINS", "PAPER", "SIGNIFICANT", "Claim", "Paper", "StudyLog", "StudyOptions", "StudyResult", "StudySettings",
    "alpha", "depth_rows", "distilled_on", "domain_rows", "domain_vs_depth", "entropy_bins", "logistic_deviance",
    "log_line", "paper_claims", "plot_study", "print_study", "prompt_records", "read_log", "run_prompts", "run_study",
    "spearman_estimate", "study_prompts", "summarise", "weighted_spearman",
]

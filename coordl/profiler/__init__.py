"""The stall profiler (DS-Analyzer's differential method): `profile` and its `ProfileResult`.

    import coordl
    result = coordl.profile(train_step, coordl.ImageFolder(root), batch_size=64, num_workers=2)
    print(result.rates, result.fetch_stall_pct, result.prep_stall_pct)
    result.plot("profile.png")

stallmodel.py is the pure model (stall decomposition, what-if predictions), measure.py the timed
runs, run.py puts them together, result.py / report.py hold and show the answer; networks.py
builds the networks `coordl profile --model` trains.
"""

from .measure import TrainStepError
from .result import ProfileResult
from .run import profile

__all__ = ["profile", "ProfileResult", "TrainStepError"]

"""Running training on idle nodes through Parsl: providers, the orchestrator, the embedded default."""
from .config import LOCAL_LABEL, local_config
from .orchestrator import Orchestrator, TrainingJob
from .pool import EmulatedPool, MultiPool, PilotPool, SitePool
from .session import training_session

__all__ = ["LOCAL_LABEL", "EmulatedPool", "MultiPool", "Orchestrator", "PilotPool", "SitePool", "TrainingJob",
           "local_config", "training_session"]

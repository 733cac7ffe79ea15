"""``import localcluster.joblib`` registers the "localcluster" joblib backend. The code is in
``integrations/joblib.py``; this is its public path."""
from .integrations.joblib import LocalClusterBackend

__all__ = ["LocalClusterBackend"]

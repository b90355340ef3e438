"""The Globus Compute cloud service, stood in for at the SDK's Executor boundary (it cannot be reached here).

``StandInEndpoint`` is the facility's endpoint: a pool of separate (spawned) processes that outlives any one
laptop. Each laptop gets a ``StandInExecutor`` - a ``globus_compute_sdk.Executor`` whose tasks go through the
SDK's own serialiser to that pool and whose ``client`` answers endpoint-status queries as the service does.
Shutting a laptop's executor down leaves the endpoint, and whatever it started, running.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor

import requests
from globus_sdk import GlobusAPIError

from parsl_bft.execution.globus import LocalEndpointExecutor

ENDPOINT_ID = "5e0f2a52-7d43-4b0c-9a1e-2f7c8d9e0a11"


class StandInEndpoint:
    def __init__(self, endpoint_id: str = ENDPOINT_ID, workers: int = 1):
        self.endpoint_id = endpoint_id
        self.status = "online"
        self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        self.tasks = 0

    def executor(self, endpoint_id: str) -> StandInExecutor:
        return StandInExecutor(self, endpoint_id)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class _Client:
    def __init__(self, endpoint: StandInEndpoint):
        self.endpoint = endpoint

    def get_endpoint_status(self, endpoint_id: str) -> dict:
        if str(endpoint_id) != self.endpoint.endpoint_id:      # what the web service answers for a stranger
            r = requests.Response()
            r.status_code, r._content = 404, b'{"code": "NOT_FOUND", "message": "Endpoint not found"}'
            r.headers["Content-Type"] = "application/json"
            r.request = requests.Request("GET", f"https://compute.api.globus.org/v2/endpoints/{endpoint_id}/status"
                                         ).prepare()
            r.url = r.request.url
            raise GlobusAPIError(r)
        return {"status": self.endpoint.status}


class StandInExecutor(LocalEndpointExecutor):
    """The SDK's serialiser on the way out and back (LocalEndpointExecutor); its tasks run on the endpoint."""

    def __init__(self, endpoint: StandInEndpoint, endpoint_id: str):
        super().__init__(endpoint_id, pool=endpoint.pool)
        self.endpoint = endpoint
        self.client = _Client(endpoint)

    def submit(self, fn, *args, **kwargs) -> Future:
        self.endpoint.tasks += 1
        return super().submit(fn, *args, **kwargs)

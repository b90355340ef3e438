"""The Python API reference (docs/reference/python-api.md) is autodoc: a field without a ``#:`` comment is a field
the reference does not explain."""
import dataclasses

from sphinx.pycode import ModuleAnalyzer

from parsl_bft.execution.training_job import TrainingJob


def test_every_training_job_field_says_what_it_does():
    docs = ModuleAnalyzer.for_module(TrainingJob.__module__).find_attr_docs()
    silent = [f.name for f in dataclasses.fields(TrainingJob) if not "".join(docs.get(("TrainingJob", f.name), []))
              .strip()]
    assert silent == [], f"TrainingJob fields without a #: comment: {silent}"


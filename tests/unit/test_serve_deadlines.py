"""The server's request deadline fits what it is deployed as: a shared public endpoint's 60 s,
a dedicated endpoint's longer timeout, a batch job's none; chosen by an environment variable
read at start, and refused when it names no deployment."""

from __future__ import annotations

import pytest

from trainer.serve.__main__ import checked_arguments, deadline_words, parser
from trainer.serve.contract import Contract


def deadline(env: dict, *argv: str) -> float:
    args = parser(env).parse_args(["gs://bucket/model", *argv])
    checked_arguments(args, Contract.from_environment({}))
    return args.request_timeout_s


@pytest.mark.parametrize(
    ("env", "argv", "seconds"),
    [
        ({}, (), 50.0),
        ({"SERVE_DEPLOYMENT": "shared"}, (), 50.0),
        ({"SERVE_DEPLOYMENT": "dedicated"}, (), 590.0),
        ({"SERVE_DEPLOYMENT": "batch"}, (), 0.0),
        ({"SERVE_DEPLOYMENT": "batch", "SERVE_REQUEST_TIMEOUT_S": "120"}, (), 120.0),
        ({"SERVE_DEPLOYMENT": "dedicated"}, ("--request_timeout_s", "900"), 900.0),
        ({}, ("--deployment", "dedicated"), 590.0),
    ],
)
def test_the_deadline_is_the_deployments_unless_given(env, argv, seconds):
    assert deadline(env, *argv) == seconds


def test_a_deployment_that_is_none_is_refused_by_name():
    with pytest.raises(ValueError, match="'dedicted'.*shared, dedicated, batch"):
        deadline({"SERVE_DEPLOYMENT": "dedicted"})


def test_the_first_line_says_the_deadline_and_why():
    args = parser({"SERVE_DEPLOYMENT": "batch"}).parse_args(["gs://bucket/model"])
    checked_arguments(args, Contract.from_environment({}))
    assert deadline_words(args) == "request deadline no limit (deployed as batch)"

"""The Secret Manager references the secrets tests give `--secret` (the loopback fake,
tests/support/secret_manager_fake.py, holds the first and refuses the second). Shared by
tests/unit/test_secrets.py and tests/processes/test_secrets_runs.py."""

RESOURCE = "projects/p/secrets/hf/versions/latest"
DENIED = "projects/p/secrets/forbidden/versions/3"

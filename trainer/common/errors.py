"""The one exception type that means "the user asked for something impossible".

Anything raised as `UserError` is printed as a single line and ends the program with
exit code 2, before any expensive work starts; raised in the training processes (what
only the loaded model or data shows), with 78 (trainer/common/exit_codes.py). Everything
else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input: the message says what is wrong and what to do instead."""

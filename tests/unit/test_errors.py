"""The exit codes the README documents, and the keyword that gives each error its own."""

import pytest

from edgespec import errors


def test_each_error_has_the_exit_code_the_readme_lists():
    family = [cls for cls in errors.EdgespecError.__subclasses__() if cls.__module__ == errors.__name__]
    codes = {cls.__name__: cls.exit_code for cls in family}
    assert codes == {
        "ConfigError": 2, "InputError": 2, "ModelNotFoundError": 3, "ModelFileError": 4, "DownloadError": 5,
        "IncompatibleModelsError": 6, "ContextError": 7, "BackendError": 8, "PlanError": 9,
    }
    assert errors.EdgespecError("x").exit_code == 1 and errors.ContextError("x").message == "x"


def test_an_error_must_name_an_exit_code_the_shell_does_not_use():
    with pytest.raises(TypeError):
        type("Silent", (errors.EdgespecError,), {})  # no exit_code: it would have exited 1 unnoticed
    for code in (0, 126, 130):
        with pytest.raises(ValueError, match=f"exit code {code} "):
            type("Odd", (errors.EdgespecError,), {}, exit_code=code)

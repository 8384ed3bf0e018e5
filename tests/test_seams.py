"""The places where the recipes' trainers reach past a library's public API (`training.*_seams`):
each is listed with the library version it was written against, and this test fails when the
installed library changes what a seam relies on (a signature, an attribute it sets), when a seam
names no test of its behaviour, or when a trainer overrides a private method outside the seams."""

import importlib
import inspect
import re
from importlib.metadata import version

import pytest
from conftest import ROOT

from medrecipes.training import trainers, transformers_seams, trl_seams

MODULES = (transformers_seams, trl_seams)
SEAMS = [(module, seam) for module in MODULES for seam in module.SEAMS]


def _owner(dotted: str):
    """The class or module a seam's `owner` names: `trl.GRPOTrainer`, `trl.trainer.utils`."""
    try:
        return importlib.import_module(dotted)
    except ImportError:
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)


def _plain(signature: inspect.Signature) -> str:
    """A signature's parameters, names, kinds and defaults, without annotations."""
    empty = inspect.Parameter.empty
    parameters = [p.replace(annotation=empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=parameters, return_annotation=empty))


def _minor(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()
    return int(major), int(minor)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.LIBRARY)
def test_the_installed_library_is_one_the_seams_were_written_against(module):
    low, high = module.WRITTEN_AGAINST
    installed = version(module.LIBRARY)
    assert _minor(low) <= _minor(installed) <= _minor(high), (
        f"{module.LIBRARY} {installed} is outside {low} to {high}: check every seam of {module.__name__} "
        "against its source, then widen WRITTEN_AGAINST"
    )


@pytest.mark.parametrize("module,seam", SEAMS, ids=[f"{s.owner}.{s.name}" for _, s in SEAMS])
def test_each_seam_is_as_it_was_written_against(module, seam):
    owner = _owner(seam.owner)
    if seam.signature is not None:  # a method or function: its parameters
        assert _plain(inspect.signature(getattr(owner, seam.name))) == seam.signature
    else:  # an attribute: the library still has it, or sets it
        assert hasattr(owner, seam.name) or f"self.{seam.name} =" in inspect.getsource(owner)
    assert seam.why and seam.behaviour.startswith("tests/")
    path, test = seam.behaviour.split("::")
    assert f"def {test}(" in (ROOT / path).read_text(), f"{seam.behaviour}: no such test"


def _library_privates(cls) -> set[str]:
    """Private methods (one leading underscore) that a library class in `cls`'s bases defines."""
    names = set()
    for base in cls.__mro__:
        if not base.__module__.startswith("medrecipes"):
            names |= {n for n in vars(base) if n.startswith("_") and not n.startswith("__")}
    return names


@pytest.mark.parametrize(
    "trainer", [c for c in vars(trainers).values() if inspect.isclass(c) and c.__module__ == trainers.__name__]
)
def test_a_trainer_overrides_library_privates_only_in_the_seams(trainer):
    listed = {(s.owner.rpartition(".")[2], s.name) for _, s in SEAMS} | {("", s.name) for _, s in SEAMS}
    library = _library_privates(trainer)
    for base in trainer.__mro__:
        if not base.__module__.startswith("medrecipes"):
            continue
        for name in set(vars(base)) & library:
            assert base.__module__ in {m.__name__ for m in MODULES}, (
                f"{base.__module__}.{base.__name__}.{name} overrides a private method of a library outside the seams"
            )
            assert ("", name) in listed, f"{base.__name__}.{name} is not listed in its module's SEAMS"

"""Property-based tests of every parser that takes user text: whatever it is given, it returns a
value or raises tfopt's one-line error class (TfoptError), never another exception. A fixed example
budget keeps them to seconds."""

import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfopt import config as C
from tfopt.core.errors import TfoptError
from tfopt.core.specs import parse_model, parse_model_args
from tfopt.launch.hosts import parse_link
from tfopt.runtime.tf_config import parse_tf_config

BUDGET = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# Text that looks like what a user types, and anything at all.
TEXT = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="abcdefxyz0123456789=:,./-_()[]{}'\" \n\t\\", max_size=80),
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


def _one_line(fn, *args):
    """Runs ``fn(*args)``: a value, or a TfoptError (any other exception fails the test)."""
    try:
        fn(*args)
    except TfoptError:
        pass


@BUDGET
@given(TEXT, TEXT)
def test_model_and_model_args(name, args):
    _one_line(parse_model, name, args)
    _one_line(parse_model_args, args)


@BUDGET
@given(st.lists(TEXT, max_size=4))
def test_set_overrides(overrides):
    _one_line(C.apply_overrides, C.RunConfig(), overrides)


@BUDGET
@given(
    st.dictionaries(
        st.sampled_from(["data", "model", "runtime", "train", "x"]), JSONISH, max_size=4
    )
)
def test_config_sections(raw):
    _one_line(C.from_dict, raw)


@BUDGET
@given(st.one_of(TEXT, JSONISH.map(json.dumps)))
def test_config_files(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    _one_line(C.load, str(path))


@BUDGET
@given(st.one_of(TEXT, JSONISH.map(json.dumps)))
def test_tf_config(text):
    _one_line(parse_tf_config, text)


@BUDGET
@given(TEXT)
def test_link(text):
    _one_line(parse_link, text)


@BUDGET
@given(TEXT)
def test_image_size_and_normalize(text):
    _one_line(C.parse_image_size, text)
    _one_line(C.parse_normalize, text)


@BUDGET
@given(st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=3, unique=True))
def test_class_folder_names(tmp_path_factory, names):
    from tfopt.data.folder_source import _check_classes, listing_digest

    root = tmp_path_factory.mktemp("imgs")
    made = []
    for name in names:
        try:
            os.makedirs(root / name)
            (root / name / "a.png").write_bytes(b"\x89PNG")
            made.append(name)
        except (OSError, ValueError):  # the file system itself refuses the name
            continue
    _one_line(listing_digest, str(root))
    _one_line(_check_classes, {"train": {n: ["a.png"] for n in made}}, str(root))

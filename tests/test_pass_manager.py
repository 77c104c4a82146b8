"""The pass manager (sparse_lower/passes/manager.py), against the contract its docstrings state:

* passes run in order; each one's `requires` sees the model it is given, `call` returns the next
  model, `ensures` sees that model, and `verify` (the tests' checker) runs after every pass;
* a failure in any of the four is a PassError (a SparseLowerError) whose message is the pass's own
  followed by the step of how many, in words, with the pass's node, reason and fix, and no pass after
  it runs;
* `dump_dir` holds the input and the model after every pass that ran, so the files say which passes
  ran before a failure.

Recording passes built here show the order; the real passes of `sparse_lower.lower` show the checks
(the onnx checker and strict shape inference after every pass, no source op left after lowering) and
the refusals of their preconditions.
"""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

import sparse_lower
from helpers import chain_model, model_with, with_nodes
from sparse_lower import SparseLowerError
from sparse_lower.lowering import Options
from sparse_lower.passes.check import check_model
from sparse_lower.passes.lower import LowerSparse
from sparse_lower.passes.manager import PassError, PassManager
from sparse_lower.passes.validate import ValidateSourceOps

REFUSAL = SparseLowerError("the tag is not wanted", "bad_node", "remove the tag")
STAGES = ["requires", "call", "ensures", "verify"]


def tags(model) -> str:
    """The names of the Tag passes that made `model`, in order."""
    return next((p.value for p in model.metadata_props if p.key == "tags"), "")


class Tag:
    """A pass that appends its name to the model's "tags" property, logging each method it runs with the
    tags of the model it sees; `fail` names the method that raises REFUSAL instead."""

    def __init__(self, name: str, log: list, fail: str | None = None):
        self.name, self.step, self.log, self.fail = name, f"tagging {name}", log, fail

    def _run(self, method: str, model) -> None:
        self.log.append((self.name, method, tags(model)))
        if method == self.fail:
            raise REFUSAL

    def requires(self, model):
        self._run("requires", model)

    def call(self, model):
        self._run("call", model)
        tagged = onnx.ModelProto()
        tagged.CopyFrom(model)
        helper.set_model_props(tagged, {"tags": ",".join(filter(None, [tags(model), self.name]))})
        return tagged

    def ensures(self, model):
        self._run("ensures", model)


class DropWeights:
    """A broken pass: it deletes the initializer W that the model's conv reads."""

    name, step = "drop-weights", "dropping the weights"

    def requires(self, model):
        """Any model."""

    def call(self, model):
        dropped = onnx.ModelProto()
        dropped.CopyFrom(model)
        index = next(i for i, t in enumerate(dropped.graph.initializer) if t.name == "W")
        del dropped.graph.initializer[index]
        return dropped

    def ensures(self, model):
        """Promises nothing."""


def recording_verify(log: list, fail_on: str | None = None):
    """A verifier that logs the tags of each model it is given and refuses the one tagged up to `fail_on`."""
    def verify(model):
        log.append(("verify", tags(model)))
        if fail_on and tags(model).endswith(fail_on):
            raise REFUSAL
    return verify


def dumps(folder) -> list[str]:
    return sorted(p.name for p in folder.glob("*.onnx"))


def source_ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node if n.domain == "sparse"]


def conv_then_relu():
    """model_with()'s SubmanifoldConv, then a Relu of its features as the output 'r': on the gpu target the
    conv becomes an IndexedConv, and fuse-epilogues folds the Relu into it."""
    model = with_nodes(model_with(), helper.make_node("Relu", ["out_features"], ["r"], name="relu"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, ["N", 4]))
    return model


def test_passes_run_in_order_each_checked_before_and_after_it(tmp_path):
    log = []
    source = model_with()
    manager = PassManager([Tag("a", log), Tag("b", log), Tag("c", log)], verify=recording_verify(log),
                          dump_dir=tmp_path)
    result = manager.run(source)
    assert log == [("a", "requires", ""), ("a", "call", ""), ("a", "ensures", "a"), ("verify", "a"),
                   ("b", "requires", "a"), ("b", "call", "a"), ("b", "ensures", "a,b"), ("verify", "a,b"),
                   ("c", "requires", "a,b"), ("c", "call", "a,b"), ("c", "ensures", "a,b,c"), ("verify", "a,b,c")]
    assert tags(result) == "a,b,c" and tags(source) == ""
    assert dumps(tmp_path) == ["00_input.onnx", "01_a.onnx", "02_b.onnx", "03_c.onnx"]
    assert [tags(onnx.load(tmp_path / name)) for name in dumps(tmp_path)] == ["", "a", "a,b", "a,b,c"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_failure_names_its_step_and_no_later_pass_runs(stage, tmp_path):
    log = []
    passes = [Tag("a", log), Tag("b", log, fail=None if stage == "verify" else stage), Tag("c", log)]
    manager = PassManager(passes, verify=recording_verify(log, fail_on="b" if stage == "verify" else None),
                          dump_dir=tmp_path)
    with pytest.raises(PassError) as info:
        manager.run(model_with())
    error = info.value
    assert isinstance(error, SparseLowerError) and error.__cause__ is REFUSAL
    assert str(error) == "node 'bad_node': the tag is not wanted (fix: remove the tag) (step 2 of 3: tagging b)"
    assert (error.node, error.reason, error.fix) == ("bad_node", "the tag is not wanted", "remove the tag")
    ran = {"requires": ["requires"], "call": ["requires", "call"], "ensures": ["requires", "call", "ensures"],
           "verify": ["requires", "call", "ensures"]}[stage]
    assert [entry[1] for entry in log if entry[0] == "b"] == ran
    assert not [entry for entry in log if entry[0] == "c"]
    assert dumps(tmp_path) == ["00_input.onnx", "01_a.onnx"]  # a ran; b did not complete


def test_the_checker_after_each_pass_catches_the_pass_that_broke_the_model():
    log = []
    manager = PassManager([Tag("a", log), DropWeights(), Tag("c", log)], verify=check_model)
    with pytest.raises(PassError) as info:
        manager.run(model_with())
    message = str(info.value)
    assert message.startswith("the model is not valid ONNX: ") and "input 'W' of node" in message, message
    assert message.endswith(" (step 2 of 3: dropping the weights)"), message
    assert info.value.node is None and info.value.fix is None
    assert [entry[0] for entry in log] == ["a", "a", "a"]  # c never ran


def test_without_a_verifier_the_manager_checks_only_the_passes_contracts():
    """`verify` is the tests' (lower's check_each_pass): without it, a pass whose ensures promises nothing
    can hand on an invalid model."""
    log = []
    result = PassManager([Tag("a", log), DropWeights(), Tag("c", log)]).run(model_with())
    assert tags(result) == "a,c" and "W" not in {t.name for t in result.graph.initializer}
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(result)


@pytest.mark.parametrize("build", [chain_model, conv_then_relu], ids=["chain", "conv-relu"])
def test_lower_checks_and_dumps_the_model_after_every_pass(build, tmp_path):
    lowered = sparse_lower.lower(build(), check_each_pass=True, dump_dir=tmp_path)
    assert dumps(tmp_path) == ["00_input.onnx", "01_validate.onnx", "02_widen-float16.onnx",
                               "03_scatter-to-dense.onnx", "04_lower-gpu.onnx", "05_fuse-epilogues.onnx",
                               "06_sort-first-sites.onnx", "07_check.onnx"]
    models = [onnx.load(tmp_path / name) for name in dumps(tmp_path)]
    assert models[0] == build() and models[1] == models[0]  # validation changes nothing
    assert models[3] == models[2] == models[1]  # nor do the next two, with no float16 and no ScatterND
    assert source_ops(models[3]) and not any(source_ops(m) for m in models[4:])
    for model in models[1:]:  # check_each_pass's check: the onnx checker, strict shape inference, typed outputs
        check_model(model)
    assert models[6] == lowered


def test_the_dumps_of_lower_show_each_pass_at_work(tmp_path):
    sparse_lower.lower(conv_then_relu(), check_each_pass=True, dump_dir=tmp_path)
    lowered, fused = (onnx.load(tmp_path / name) for name in ("04_lower-gpu.onnx", "05_fuse-epilogues.onnx"))
    conv = next(n for n in lowered.graph.node if n.op_type == "IndexedConv")
    assert [n.op_type for n in lowered.graph.node if conv.output[0] in n.input] == ["Relu"]
    fused_conv = next(n for n in fused.graph.node if n.op_type == "IndexedConv")
    assert helper.get_attribute_value(next(a for a in fused_conv.attribute if a.name == "activation")) == b"relu"
    assert "Relu" not in {n.op_type for n in fused.graph.node} and fused_conv.output[0] == "r"


def test_a_precondition_refused_reports_the_passes_that_ran(tmp_path):
    """LowerSparse requires a default opset its emitted ops exist in: the nna's are opset 16."""
    model = model_with()
    model.opset_import[0].version = 15
    manager = PassManager([ValidateSourceOps(), LowerSparse("nna", Options())], verify=check_model,
                          dump_dir=tmp_path)
    with pytest.raises(PassError) as info:
        manager.run(model)
    assert str(info.value) == ("the model imports ONNX opset 15; the nna lowering emits opset-16 ops (fix: convert "
                               "the model with onnx.version_converter first) (step 2 of 2: lowering for the nna "
                               "target)")
    assert dumps(tmp_path) == ["00_input.onnx", "01_validate.onnx"]


class LowerNothing(LowerSparse):
    """The gpu lowering with a bug: its call returns the model as it was."""

    def call(self, model):
        return model


def test_a_source_op_left_after_lowering_is_refused_by_its_ensures():
    with pytest.raises(PassError) as info:
        PassManager([ValidateSourceOps(), LowerNothing("gpu", Options())]).run(model_with())
    assert str(info.value) == ("node 'bad_node': 1 source nodes were not lowered (step 2 of 2: lowering for the gpu "
                               "target)")


def test_validation_first_refuses_an_op_no_rule_lowers_with_the_precise_message():
    """An op of the source domain that no rule lowers is validation's to refuse, in step 1."""
    model = with_nodes(model_with(), helper.make_node("SparseAvgPool", ["out_features", "out_coords"], ["pooled"],
                                                      name="pool", domain="sparse"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("pooled", onnx.TensorProto.FLOAT, ["N", 4]))
    with pytest.raises(PassError) as info:
        PassManager([ValidateSourceOps(), LowerSparse("gpu", Options())]).run(model)
    assert str(info.value) == ("node 'pool': unknown op 'sparse::SparseAvgPool' (fix: use one of SubmanifoldConv, "
                               "SparseConv, SparseDeconv, ToSparse, ToDense, SparseMaxPool, Coalesce) (step 1 of 2: "
                               "checking the source model)")

"""held_stderr: descriptor 2 while a rank connects goes to its failure report, not the terminal."""

import os
import traceback

import pytest

from zero_lab.runtime.startup_output import held_stderr


def test_what_native_code_prints_while_connecting_is_written_out_after_a_success(capfd):
    with held_stderr():
        os.write(2, b"[gloo] a warning from C++\n")
        assert capfd.readouterr().err == ""  # held, not yet on the terminal
    assert capfd.readouterr().err == "[gloo] a warning from C++"


def test_on_failure_the_held_lines_go_into_the_error_and_not_to_the_terminal(capfd):
    with pytest.raises(RuntimeError) as caught, held_stderr():
        os.write(2, b"ERROR failed to connect, willRetry=1\n")
        raise RuntimeError("Gloo connectFullMesh failed")
    assert capfd.readouterr().err == ""
    report = "".join(traceback.format_exception(caught.value))
    assert "printed while connecting:\nERROR failed to connect, willRetry=1" in report


def test_descriptor_2_is_the_terminal_again_after_the_block(capfd):
    with pytest.raises(KeyboardInterrupt), held_stderr():
        raise KeyboardInterrupt
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"

"""``/dev/kmsg`` escapes are decoded before the reader sees a record.

``/dev/kmsg`` writes every byte of a message below 0x20 or from 0x7f, and the backslash,
as ``\\xHH`` (kernel ``printk.c``, ``msg_add_ext_text``). The follower fed the escaped
text to the reader, so the evidence of a fault read from ``/dev/kmsg`` held ``\\x0a``
where the kernel printed a newline (the driver prints its fallen-off-the-bus block as one
message of three lines), ``\\x5c`` for a backslash and ``\\xc3\\xa4`` for an ``ä``. The
follower now decodes them (control characters other than tab and newline stay escaped)
and feeds each line of a multi-line message as a line of its own, with the record's
timestamp.

Lines: Xid 79 corpus ``x02``; the ``nv.c`` block as tests/data/signals/multiline.log
prints it.
"""

from __future__ import annotations

import json
from unittest import mock

from agent import kmsg as K
from agent.readers import FaultEvent, KernelLogReader
from tests import corpus
from tests.unit.test_agent_kmsg_break8 import FakeKmsg

_RECORDS = {json.loads(ln)["id"]: json.loads(ln) for ln in
            corpus.CORPUS.read_text().splitlines() if ln.strip()}
XID79 = _RECORDS["x02"]["text"]  # "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has ..."
BLOCK = ["NVRM: The NVIDIA GPU 0000:02:00.0",
         "NVRM: (PCI ID: 10de:20b2) installed in this system has",
         "NVRM: fallen off the bus and is not responding to commands."]
# the block as /dev/kmsg gives it: one record, its newlines escaped
BLOCK_KMSG = "[74889.644140] " + r"\x0a".join(BLOCK)


def _poll(texts: list[str]) -> list[FaultEvent]:
    dev = FakeKmsg()
    with mock.patch.object(K, "os", dev.module()):
        f = K.KernelLogFollower("/dev/kmsg", KernelLogReader, from_start=True)
        for t in texts:
            dev.add(t)
        got: list[FaultEvent] = f.poll() + f.poll()
    return got


def test_a_multi_line_message_is_read_as_its_lines_without_escapes() -> None:
    lost, = _poll([BLOCK_KMSG])
    assert (lost.kind, lost.pci) == ("gpu_lost", "0000:02:00.0")
    assert "\\x" not in lost.text
    assert [ln.split("] ", 1)[1] for ln in lost.text.split("\n")] == BLOCK
    xid, = _poll([XID79, BLOCK_KMSG])
    assert (xid.kind, xid.xid, xid.pci) == ("xid", 79, "0000:02:00")
    assert [ev.split("] ", 1)[1] for ev in xid.details["related_evidence"][0].split("\n")] \
        == BLOCK


def test_escaped_bytes_are_decoded_in_evidence_and_fields() -> None:
    line = ("[74889.644138] NVRM: Xid (PCI:0000:02:00): 13, pid=4242, name=tr\\xc3\\xa4in\\x5cer,"
            " Graphics Exception: ESR 0x405840=0x\\x09ok")
    ev, = _poll([line])
    assert (ev.kind, ev.xid, ev.pid, ev.process) == ("xid", 13, 4242, "träin\\er")
    assert "\\x" not in ev.text and "\t" in ev.text
    assert K.unescape_kmsg(r"a\x1b[31mb\x0dc\xffd") == r"a\x1b[31mb\x0dc\xffd"
    assert K.kmsg_to_lines("6,1,5,-;one\\x0a\\x0atwo\\x0a") == ["[    0.000005] one",
                                                              "[    0.000005] two"]

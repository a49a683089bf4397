"""stoker/protos/leases.py: a lease token proves one unit to one worker of one job, and nothing else."""

from stoker.protos.leases import LeaseSigner


def test_a_token_proves_only_its_own_lease():
    signer = LeaseSigner.new("job-1")
    token = signer.token(7, "host-a", "host-a/p0.1", "cpu-0")
    assert signer.valid(token, 7, "host-a", "host-a/p0.1", "cpu-0")
    for other in ((8, "host-a", "host-a/p0.1", "cpu-0"), (7, "host-b", "host-a/p0.1", "cpu-0"),
                  (7, "host-a", "host-a/p0.2", "cpu-0"), (7, "host-a", "host-a/p0.1", "rogue")):
        assert not signer.valid(token, *other)
    assert not LeaseSigner(signer.key, "job-2").valid(token, 7, "host-a", "host-a/p0.1", "cpu-0")
    assert not LeaseSigner.new("job-1").valid(token, 7, "host-a", "host-a/p0.1", "cpu-0")  # another key
    assert not signer.valid(token[:-1], 7, "host-a", "host-a/p0.1", "cpu-0")


def test_release_labels_are_a_closed_set():
    from stoker.protos.leases import RELEASE_LABELS, UNREACHABLE, release_label

    assert release_label(UNREACHABLE) == UNREACHABLE and UNREACHABLE in RELEASE_LABELS
    assert [release_label(r) for r in ("process exit 139", "process exit SIGSEGV", "process exit signal 64")] == [
        "process exit 139", "process exit SIGSEGV", "process exit signal 64"]
    strays = ("process exit 1234", "process exit SIGSEGV\n", "anything", "", "process exit \u0663\u0663",
              "process exit 007", "process exit SIGZZZZ", "process exit signal 999")
    assert [release_label(r) for r in strays] == ["other"] * len(strays)
    assert len(RELEASE_LABELS) < 500  # closed: every value a metric can carry, spelt once

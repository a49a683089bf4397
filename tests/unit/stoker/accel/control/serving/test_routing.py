"""From a ROUTER's frames to a request: bad frames and headers dropped by reason, names checked, replies kept."""

from stoker.accel.control.serving.routing import MAX_NAME, ReplyCache, one_line, read_request, too_long
from stoker.protos import stoker_pb2 as pb
from stoker.protos.framing import MAX_HEADER_BYTES


def test_frames_that_are_not_one_request_are_dropped_by_reason_and_a_good_one_is_parsed():
    drops, heard = [], []

    def read(frames):
        return read_request(frames, pb.ControlRequest, lambda reason, peer: drops.append((reason, peer)),
                            lambda peer, frame: heard.append(peer))

    assert read([b"p", b"a", b"b"]) is None and read([b"p", b"x" * (MAX_HEADER_BYTES + 1)]) is None
    assert read([b"p", b"\xff\xff"]) is None
    assert drops == [("bad_frames", b"p"), ("bad_frames", b"p"), ("bad_header", b"p")]
    assert heard == [b"p"]  # heard before the parse, after the frames were counted
    request = pb.ControlRequest(request_id=3, heartbeat=pb.Heartbeat(host_id="h"))
    peer, parsed, kind = read([b"q", request.SerializeToString()])
    assert peer == b"q" and parsed == request and kind == "heartbeat"


def test_a_request_in_the_other_service_s_envelope_has_no_kind_here_and_is_dropped():
    """The dispatcher's ControlRequest and the fleet's FleetRequest share no kind: a request sent to the wrong
    service is dropped and counted as a malformed one, in both directions; a request of no kind too."""
    drops = []

    def read(envelope, message, misdirected=None):
        return read_request([b"p", message.SerializeToString()], envelope, lambda reason, peer: drops.append(reason),
                            misdirected=misdirected)

    fleet_beat = pb.FleetRequest(request_id=1, fleet_job=pb.FleetJob(job_id="j", endpoint="tcp://a:1", weight=2.0))
    host_beat = pb.FleetRequest(request_id=2, fleet_host=pb.FleetHost(host_id="h", procs=2))
    register = pb.ControlRequest(request_id=3, register=pb.Register(host_id="h", procs=2))
    attach = pb.ControlRequest(request_id=4, attach=pb.Attach(consumer_id="c"), job_credential=b"s" * 64)
    for envelope, message in ((pb.ControlRequest, fleet_beat), (pb.ControlRequest, host_beat),
                              (pb.FleetRequest, register), (pb.FleetRequest, attach),
                              (pb.FleetRequest, pb.FleetRequest(request_id=5))):
        assert read(envelope, message) is None
    assert drops == ["bad_header"] * 5
    # a service that says what it is: the other service's requests are counted misdirected and their senders told
    told: list[tuple[bytes, int]] = []
    for envelope, message in ((pb.ControlRequest, fleet_beat), (pb.FleetRequest, register),
                              (pb.FleetRequest, pb.FleetRequest(request_id=5))):
        assert read(envelope, message, lambda peer, request_id: told.append((peer, request_id))) is None
    assert drops[5:] == ["misdirected", "misdirected", "bad_header"] and told == [(b"p", 1), (b"p", 3)]
    assert read(pb.FleetRequest, fleet_beat)[1:] == (fleet_beat, "fleet_job")
    assert read(pb.FleetRequest, host_beat)[2] == "fleet_host"
    # the fleet's kinds keep the numbers they had in ControlRequest: a host's or a job's bytes are what they were
    assert [f.number for f in pb.FleetRequest.DESCRIPTOR.oneofs_by_name["kind"].fields] == [12, 13]
    assert [f.number for f in pb.FleetReply.DESCRIPTOR.oneofs_by_name["kind"].fields] == [7, 13, 14]
    assert not {f.number for f in pb.ControlRequest.DESCRIPTOR.fields} & {12, 13}
    assert not {f.number for f in pb.ControlReply.DESCRIPTOR.fields} & {13, 14}


def test_names_too_long_or_with_control_characters_and_one_line_text():
    assert not too_long(pb.Register(host_id="h0"))
    assert too_long(pb.Register(host_id="h" * (MAX_NAME + 1))) and too_long(pb.Register(host_id="h\n0"))
    assert too_long(pb.Release(host_id="h", worker_ids=["w\x1b"])) and too_long(pb.Release(reason="r" * 300))
    beat = pb.Heartbeat(host_id="h0", activity=[pb.ProcessActivity(worker_id="h0/p0.1")])
    assert not too_long(beat)
    beat.activity.add(worker_id="w" * 100_000)  # a process name that would be a 100 KB label of the stall gauge
    assert too_long(beat)
    assert one_line("a\nb\u2028c") == "a\\x0ab?c"


def test_a_retry_gets_the_reply_already_made_and_the_cache_is_bounded():
    cache = ReplyCache(most=2)
    cache.put(b"a", 1, b"one")
    assert cache.get(b"a", 1) == b"one" and cache.get(b"a", 2) is None and cache.get(b"b", 1) is None
    cache.put(b"b", 1, b"x")
    cache.put(b"c", 1, b"y")
    assert len(cache) == 2 and cache.get(b"a", 1) is None

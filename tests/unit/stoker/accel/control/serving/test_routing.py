"""From a ROUTER's frames to a request: bad frames and headers dropped by reason, names checked, replies kept."""

from stoker.accel.control.serving.routing import MAX_NAME, ReplyCache, one_line, read_request, too_long
from stoker.protos import stoker_pb2 as pb
from stoker.protos.framing import MAX_HEADER_BYTES


def test_frames_that_are_not_one_request_are_dropped_by_reason_and_a_good_one_is_parsed():
    drops, heard = [], []

    def read(frames):
        return read_request(frames, lambda reason, peer: drops.append((reason, peer)),
                            lambda peer, frame: heard.append(peer))

    assert read([b"p", b"a", b"b"]) is None and read([b"p", b"x" * (MAX_HEADER_BYTES + 1)]) is None
    assert read([b"p", b"\xff\xff"]) is None
    assert drops == [("bad_frames", b"p"), ("bad_frames", b"p"), ("bad_header", b"p")]
    assert heard == [b"p"]  # heard before the parse, after the frames were counted
    request = pb.ControlRequest(request_id=3, heartbeat=pb.Heartbeat(host_id="h"))
    peer, parsed = read([b"q", request.SerializeToString()])
    assert peer == b"q" and parsed == request


def test_names_too_long_or_with_control_characters_and_one_line_text():
    assert not too_long(pb.Register(host_id="h0"))
    assert too_long(pb.Register(host_id="h" * (MAX_NAME + 1))) and too_long(pb.Register(host_id="h\n0"))
    assert too_long(pb.Release(host_id="h", worker_ids=["w\x1b"])) and too_long(pb.Release(reason="r" * 300))
    assert one_line("a\nb\u2028c") == "a\\x0ab?c"


def test_a_retry_gets_the_reply_already_made_and_the_cache_is_bounded():
    cache = ReplyCache(most=2)
    cache.put(b"a", 1, b"one")
    assert cache.get(b"a", 1) == b"one" and cache.get(b"a", 2) is None and cache.get(b"b", 1) is None
    cache.put(b"b", 1, b"x")
    cache.put(b"c", 1, b"y")
    assert len(cache) == 2 and cache.get(b"a", 1) is None

# session: one host's whole part of a launch, on one SSH channel and one interpreter: the
# preflight probe, a wait for the coordinator's go, staging the code, a wait for the start,
# then following the node's log. Shipped after common.py, probe.py, boot.py and follow.py.
# ARGS: {"probe": probe ARGS, or None to skip the preflight}
# stdin after the header: {"go": true, "boot": boot ARGS} and the code bytes, then later
# {"start": true}; {"go": false} / {"start": false} (or EOF) end it there, and a node staged
# but not started is removed. After the start stdin stays open: its EOF means the
# coordinator went away, and the follower ends (the run goes on).
# stdout, one JSON line each: the probe's facts (if asked); after the go, {"released": true}
# once the probe's listeners are closed (the rendezvous port is free for torchrun); stage()'s
# answer; after the start, start()'s answer; then, if the node started, the raw bytes of
# node.log and, at the end, the node's status record on stderr, as follow.py sends them.


def _order():
    line = sys.stdin.buffer.readline()
    try:
        order = json.loads(line.decode("utf-8")) if line.strip() else {}
    except ValueError:
        order = {}
    return order if isinstance(order, dict) else {}


def session_main(args):
    held = []
    if args.get("probe") is not None:
        facts, held = probe(args["probe"])
        emit(facts)
    order = _order()
    release(held)
    if not order.get("go"):
        return
    emit({"released": True})
    staged = stage(order["boot"], sys.stdin.buffer)
    emit(staged)
    if not staged.get("ok"):
        return
    if not _order().get("start"):
        discard(staged["rundir"])
        return
    answer = start(order["boot"])
    emit(answer)
    state = answer.get("state") or {}
    if answer.get("ok") and state.get("state") == "running":
        follow_main({"rundir": answer["rundir"], "offset": 0})

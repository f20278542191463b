# session: one host's whole part of a launch, on one SSH channel and one interpreter: the
# preflight probe, a wait for the coordinator's go, boot, then following the node's log.
# Shipped after common.py, probe.py, boot.py and follow.py.
# ARGS: {"probe": probe ARGS, or None to skip the preflight}
# stdin after the header: one JSON line, {"go": true, "boot": boot ARGS} followed by the code
# bytes, or {"go": false} (or EOF) to end here. Then it stays open: EOF means the coordinator
# went away, and the follower ends (the run goes on).
# stdout: the probe's facts line (if asked); after the go, {"released": true} once the probe's
# listeners are closed (the rendezvous port is free for torchrun); then boot's answer line;
# then, if the node started, the raw bytes of node.log and, at the end, the node's status
# record on stderr, exactly as follow.py sends them.


def session_main(args):
    held = []
    if args.get("probe") is not None:
        facts, held = probe(args["probe"])
        emit(facts)
    line = sys.stdin.buffer.readline()
    release(held)
    try:
        order = json.loads(line.decode("utf-8")) if line.strip() else {}
    except ValueError:
        order = {}
    if not isinstance(order, dict) or not order.get("go"):
        return
    emit({"released": True})
    answer = boot(order["boot"], sys.stdin.buffer)
    emit(answer)
    state = answer.get("state") or {}
    if answer.get("ok") and state.get("state") == "running":
        follow_main({"rundir": answer["rundir"], "offset": 0})

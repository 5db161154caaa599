"""Hints for ps_sync, one level at a time (``minipar exercise hint ps_sync``)."""

HINTS = (
    """Two roles in one function: if comm.Get_rank() == 0 you are the server, else a
worker.  A worker sends its gradient x to rank 0 and then waits for the new
parameters from rank 0.  The server does everything in between.""",
    """The order on the server: receive the W = N-1 gradients (one comm.Recv per
worker, into a buffer, adding them up), average them (divide by W, once),
update the momentum buffer state["v"] IN PLACE and the parameters, and only
then send the new parameters to every worker.  Sending anything before all
gradients arrived hands the workers stale parameters.""",
    """The step, on the server (W = N - 1):
    total = sum of the W received gradients
    v = state["v"];  v *= momentum;  v += total / W
    new = params - lr * v
    for w in 1 .. N-1: comm.Send(new, dest=w)
On a worker:  comm.Send(x, dest=0);  new = np.empty_like(params);
    comm.Recv(new, source=0);  return new""",
)

"""Hints for gpipe_schedule, one level at a time (``minipar exercise hint gpipe_schedule``)."""

HINTS = (
    """Two loops and a last instruction.  The first loop does micro-batches 0 .. m-1
forward, the second does them backward (last one first), then OptimizerStep().
Every Forward needs its input first, every Backward needs the gradient of its
output first — except where the pipeline ends.""",
    """Around each Forward(i): RecvAct(i) before it unless stage == 0, SendAct(i)
after it unless stage == p - 1.  Around each Backward(i): RecvGrad(i) before it
unless stage == p - 1, SendGrad(i) after it unless stage == 0.  With p = 1 the
only stage is both first and last: no messages at all.""",
    """for i in range(m):
    out += ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])
for i in reversed(range(m)):
    out += ([] if last else [RecvGrad(i)]) + [Backward(i)] + ([] if first else [SendGrad(i)])
return out + [OptimizerStep()]""",
)

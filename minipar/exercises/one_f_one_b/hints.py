"""Hints for one_f_one_b, one level at a time (``minipar exercise hint one_f_one_b``)."""

HINTS = (
    """Write two small helpers first: forward(i) -> [RecvAct(i)?, Forward(i), SendAct(i)?]
and backward(i) -> [RecvGrad(i)?, Backward(i), SendGrad(i)?] (the messages left out
where the pipeline ends).  Then the schedule is three loops over them: warm-up,
steady state, cool-down.""",
    """Warm-up: forward(i) for i in range(warmup).  Steady state: for i in
range(m - warmup), forward(warmup + i) then backward(i) — the forward of the
newest micro-batch, the backward of the oldest one held.  Cool-down: backward(i)
for i in range(m - warmup, m).  The last stage has warmup 0: F0 B0 F1 B1 ...""",
    """def forward(i):
    return ([] if first else [RecvAct(i)]) + [Forward(i)] + ([] if last else [SendAct(i)])
def backward(i):
    return ([] if last else [RecvGrad(i)]) + [Backward(i)] + ([] if first else [SendGrad(i)])
for i in range(warmup):
    out += forward(i)
for i in range(m - warmup):
    out += forward(warmup + i) + backward(i)
for i in range(m - warmup, m):
    out += backward(i)
return out + [OptimizerStep()]""",
)

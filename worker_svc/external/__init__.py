"""The external engine (design 004): EXTERNAL tasks run at outside providers under slot pools.

`app` (the process parts), `engine` (hand-outs, slots and the tick loop), `states` (the state machine),
`handlers` (one plugin per kind of provider; `http-async` the reference one), `output` (the result a job's output
becomes). README "External providers" tells the whole design.
"""

"""The stream relay: one OpenAI stream to the client that outlives the replica streaming it.

It sits in front of the chat API's replicas (end users call it; nothing else), passes each answer's chunks
on, and when a replica's stream is cut part-way (the pod killed, its node gone silent, its Triton failed)
asks another replica to continue the same answer (``continue_final_message``), so the client sees one
stream that completes. ``splice`` is the pure part (what was sent, the request that resumes it, the chunks
rewritten); ``server`` the I/O (docs/runtime.md "Streams that survive their replica").
"""

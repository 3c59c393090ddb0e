"""Traffic on the fleet, real and simulated: chat clients, simulators and release scenarios under load.

Real traffic: ``realpods`` (a ChatbotService put on the real node, ``ChatLoad`` users through its
Service, per-pod figures from Prometheus), ``dialogues`` (``DialogueLoad``: multi-turn streamed
dialogues) and ``releasetraffic`` (releases driven while those dialogues run). Simulated traffic for kwok
pods, which run no containers: ``trafficsim`` (the runtime's metrics per track) and ``fleetsim`` (demand
over time served by a simulated fleet).
"""

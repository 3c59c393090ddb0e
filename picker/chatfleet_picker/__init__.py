"""Chatfleet's endpoint picker: the Gateway API Inference Extension's picker for a ChatbotService's
InferencePools (ext_proc), keeping dialogues on the replica that holds their prefix KV and on the
revision that began them, and new dialogues on the least-loaded replica of the track the route chose."""

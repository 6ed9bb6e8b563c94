"""A product backend calling Apprentice over gRPC with the light client (`pip install ./clients/python`):
ask, show the answer, send the user's feedback with the answer's interaction id.

Settings (defaults: the local stack of `apprentice up`, run from the repository root):
APPRENTICE_TARGET (gRPC host:port), APPRENTICE_CA (CA that signed the server's certificate),
APPRENTICE_API_KEY (a backend key; default: the `default` tenant's key file).
"""

import json
import os
from pathlib import Path

from apprentice_client import InferenceClient

SECRETS = Path(".apprentice/secrets")
target = os.environ.get("APPRENTICE_TARGET", "localhost:50051")
ca_file = os.environ.get("APPRENTICE_CA", SECRETS / "ca.pem")
api_key = os.environ.get("APPRENTICE_API_KEY") or (SECRETS / "backend-default.token").read_text().strip()

with InferenceClient(target, api_key=api_key, ca_file=ca_file, timeout=30) as client:
    reply = client.generate(
        [{"role": "system", "content": "You are the support desk of an online shop."},
         {"role": "user", "content": "How do I return a parcel?"}],
        max_new_tokens=64, temperature=0.7, session_id="user-42-chat-7", task="support")
    answer = reply.choices[0]
    print(answer.text)
    # When the user reacts: thumbs (+1/-1), rating (1-5), correction (comment=...) or kpi (kpi_name=...).
    ack = client.feedback(answer.interaction_id, "thumbs", 1)

print(json.dumps({"interaction_id": answer.interaction_id, "policy_version": reply.policy_version,
                  "feedback_event_id": ack.event_id, "accepted": ack.accepted}))

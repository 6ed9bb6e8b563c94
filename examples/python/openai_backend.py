"""A product backend calling Apprentice with the official OpenAI SDK (`pip install openai`): only the
base URL and the key change. Feedback goes to the Apprentice extension `POST /v1/feedback` with the
completion's `id`, which is the interaction id of its first choice.

Settings (defaults: the local stack of `apprentice up`, run from the repository root):
APPRENTICE_BASE_URL (the HTTP API), APPRENTICE_CA (CA that signed the server's certificate),
APPRENTICE_API_KEY (a backend key; default: the `default` tenant's key file).
"""

import json
import os
import ssl
from pathlib import Path

import httpx
from openai import OpenAI

SECRETS = Path(".apprentice/secrets")
base_url = os.environ.get("APPRENTICE_BASE_URL", "https://localhost:8000/v1")
ca_file = os.environ.get("APPRENTICE_CA", str(SECRETS / "ca.pem"))
api_key = os.environ.get("APPRENTICE_API_KEY") or (SECRETS / "backend-default.token").read_text().strip()

# The stack's own CA; drop `verify` for a server with a publicly trusted certificate.
http = httpx.Client(verify=ssl.create_default_context(cafile=ca_file), timeout=30)
client = OpenAI(base_url=base_url, api_key=api_key, http_client=http)
model = client.models.list().data[0].id           # the served model, routed as gRPC calls are
completion = client.chat.completions.create(
    model=model, max_tokens=64, temperature=0.7, user="user-42-chat-7",
    messages=[{"role": "system", "content": "You are the support desk of an online shop."},
              {"role": "user", "content": "How do I return a parcel?"}],
    extra_body={"task": "support"})
print(completion.choices[0].message.content)
# When the user reacts: the same body as gRPC's FeedbackRequest.
ack = http.post(f"{base_url}/feedback", headers={"Authorization": f"Bearer {api_key}"},
                json={"interaction_id": completion.id, "kind": "thumbs", "value": 1}).raise_for_status().json()

print(json.dumps({"interaction_id": completion.id, "policy_version": completion.system_fingerprint,
                  "feedback_event_id": ack["event_id"], "accepted": ack["accepted"]}))

"""Inference: serve the policy over gRPC, capture every interaction, accept feedback, hot-swap weights.

GenerateRequest --> (validate, route to a version) --> engine batch --> GenerateResponse
                                                                   \\--> Interaction (capture, off the response path)
FeedbackRequest --> FeedbackEvent;  ModelUpdate --> download + load + swap (between batches).
"""

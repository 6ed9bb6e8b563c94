"""Knowledge items at run time, shared by the services that read them: the injection-safe frame that puts
items in a prompt (inference serving, the trainer's teacher), retrieval of the items relevant to a request,
and what a correct answer to an item contains (the extractor writes it, the eval gate checks it)."""

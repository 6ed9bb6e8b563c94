"""General prompts for the replay share of a drill round (services/trainer/drill.py): the round-start model
answers them greedily and the student keeps those answers while it learns the tenant's facts.

Everyday requests of every kind, written for this purpose. None is a question of the weights gate's OOD set
(services/weights/evalsets/ood.yaml; tests/unit/trainer/test_drill.py checks), so the gate still measures
general behaviour on questions the update never saw.
"""

REPLAY_PROMPTS: tuple[str, ...] = (
    "Give me one tip for keeping houseplants alive.",
    "Write a short sentence about autumn leaves.",
    "What is a polite way to decline an invitation?",
    "Name three fruits that are yellow.",
    "How can I make my morning routine faster?",
    "Describe a bicycle in one sentence.",
    "What should I pack for a day at the beach?",
    "Suggest a name for a small bakery.",
    "How do I write a thank-you note to a teacher?",
    "Explain what a rainbow is in simple words.",
    "Give me a quick idea for a vegetarian dinner.",
    "What is a good habit for saving money?",
    "Write one sentence to welcome a new colleague.",
    "How do I clean a coffee mug with stains?",
    "Name two animals that live in the desert.",
    "What is one way to stay focused while studying?",
    "Describe the smell of fresh bread.",
    "How should I prepare for a job interview?",
    "Give me a fun fact about the moon.",
    "What can I do on a rainy weekend?",
    "Write a friendly reminder about a meeting tomorrow.",
    "How do I keep my phone battery healthy?",
    "Suggest a simple stretching exercise for the neck.",
    "What is the difference between a lake and a sea?",
    "Give me a short motivational sentence.",
    "How do I start learning to play the guitar?",
    "Describe a sunset over the mountains in one sentence.",
    "What should I do before a long car trip?",
    "Name a board game that families enjoy.",
    "How do I make a cup of green tea?",
    "Write a one-line birthday wish for a friend.",
    "What is a good way to remember names?",
)

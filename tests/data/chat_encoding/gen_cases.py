# Generates cases.json: each request rendered by the DeepSeek-V4.1 reference encoder
# (encoding/encoding.py of the model repository, NOT part of this tree). Usage:
#   REF_ENCODING_DIR=/path/to/encoding python3 gen_cases.py cases.json
import copy, json, sys
import os
sys.path.insert(0, os.environ.get('REF_ENCODING_DIR', '.'))  # folder holding the reference encoding.py
import encoding as ref

W = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.\nReturns \"temp\" in °C.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. 北京"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 3},
                    "threshold": {"type": "number", "default": 0.5, "multipleOf": 1.0, "epsilon": 1e-05, "big": 1e16, "neg": -2.50},
                    "units": {"type": "string", "enum": ["c", "f"]}, "verbose": {"type": "boolean", "default": False},
                    "extra": {"type": ["string", "null"], "default": None}},
                    "required": ["city"]}}}
S = {"type": "function", "function": {"name": "search", "description": "Web search\ttool", "parameters": {"type": "object",
     "properties": {"q": {"type": "string"}, "top_k": {"type": "integer"}}, "required": ["q"]}}}

def call(i, name, args, as_string=True):
    return {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}

CASES = [
 ("plain_user_chat", {"messages": [{"role": "user", "content": "How many r in strawberry?"}]}),
 ("plain_user_thinking_default_effort", {"messages": [{"role": "user", "content": "How many r in strawberry?"}], "chat_template_kwargs": {"thinking": True}}),
 ("system_user_chat", {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}], "chat_template_kwargs": {"thinking": False}}),
 ("effort_low", {"messages": [{"role": "system", "content": "Be careful."}, {"role": "user", "content": "Hi"}], "chat_template_kwargs": {"thinking": True}, "reasoning_effort": "low"}),
 ("effort_high", {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"thinking": True}, "reasoning_effort": "high"}),
 ("effort_max", {"messages": [{"role": "user", "content": "Prove it."}], "chat_template_kwargs": {"thinking": True}, "reasoning_effort": "max"}),
 ("effort_int_42", {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"thinking": True}, "reasoning_effort": 42}),
 ("effort_ignored_in_chat_mode", {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "max"}),
 ("enable_thinking_alias", {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": True}}),
 ("thinking_key_wins_over_alias", {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"thinking": False, "enable_thinking": True}}),
 ("multi_turn_chat", {"messages": [{"role": "user", "content": "First question"}, {"role": "assistant", "content": "First answer"}, {"role": "user", "content": "Second question"}]}),
 ("multi_turn_thinking_drops_old_reasoning", {"messages": [
     {"role": "system", "content": "sys"}, {"role": "user", "content": "1+1=?"},
     {"role": "assistant", "content": "2", "reasoning_content": "one plus one"},
     {"role": "user", "content": "2+2=?"}, {"role": "assistant", "content": "4", "reasoning_content": "two plus two"},
     {"role": "user", "content": "3+3=?"}], "chat_template_kwargs": {"thinking": True}}),
 ("multi_turn_thinking_with_tools_keeps_reasoning", {"messages": [
     {"role": "user", "content": "1+1=?"}, {"role": "assistant", "content": "2", "reasoning_content": "one plus one"},
     {"role": "user", "content": "2+2=?"}], "tools": [S], "chat_template_kwargs": {"thinking": True}}),
 ("tools_user_first_chat", {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [W, S]}),
 ("tools_system_first_thinking", {"messages": [{"role": "system", "content": "You may use tools."}, {"role": "user", "content": "Weather in Paris?"}], "tools": [W], "chat_template_kwargs": {"thinking": True}, "reasoning_effort": "max"}),
 ("tool_call_and_result_thinking", {"messages": [
     {"role": "system", "content": "You may use tools."}, {"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "reasoning_content": "need the tool",
      "tool_calls": [call("c1", "get_weather", {"city": "Paris", "days": 3, "metric": True})]},
     {"role": "tool", "tool_call_id": "c1", "content": "18C, cloudy"},
     {"role": "user", "content": "And tomorrow?"}], "tools": [W], "chat_template_kwargs": {"thinking": True}}),
 ("tool_result_last_generation", {"messages": [
     {"role": "user", "content": "Compare Paris and Rome"},
     {"role": "assistant", "content": None, "tool_calls": [call("a", "get_weather", {"city": "Paris"}), call("b", "get_weather", {"city": "Rome"})]},
     {"role": "tool", "tool_call_id": "a", "content": "18C"}, {"role": "tool", "tool_call_id": "b", "content": "24C"}],
     "tools": [W], "chat_template_kwargs": {"thinking": True}}),
 ("tool_results_out_of_order_sorted", {"messages": [
     {"role": "user", "content": "both"},
     {"role": "assistant", "content": "", "tool_calls": [call("a", "search", {"q": "P"}), call("b", "search", {"q": "R"}), call("c", "search", {"q": "S"})]},
     {"role": "tool", "tool_call_id": "c", "content": "third"}, {"role": "tool", "tool_call_id": "a", "content": "first"},
     {"role": "tool", "tool_call_id": "b", "content": "second"}], "tools": [S]}),
 ("tool_call_args_object_and_nested_values", {"messages": [
     {"role": "user", "content": "go"},
     {"role": "assistant", "content": "Calling.", "tool_calls": [call("x", "search", {"q": "naïve \"quoted\"\nline", "top_k": 5, "ratio": 0.25, "flag": False, "none": None, "list": [1, 2.0, "三"], "obj": {"k": 1e-7}}, as_string=False)]},
     {"role": "tool", "tool_call_id": "x", "content": "ok"}, {"role": "user", "content": "thanks"}], "tools": [S]}),
 ("tool_call_args_bad_json_string", {"messages": [
     {"role": "user", "content": "go"},
     {"role": "assistant", "content": "", "tool_calls": [{"id": "y", "type": "function", "function": {"name": "search", "arguments": "not json {"}}]},
     {"role": "user", "content": "again"}]}),
 ("tool_call_args_double_encoded", {"messages": [
     {"role": "user", "content": "go"},
     {"role": "assistant", "content": "", "tool_calls": [{"id": "z", "type": "function", "function": {"name": "search", "arguments": json.dumps(json.dumps({"q": "deep", "top_k": 2}))}}]},
     {"role": "user", "content": "again"}], "chat_template_kwargs": {"thinking": True}}),
 ("content_parts_lists", {"messages": [
     {"role": "system", "content": [{"type": "text", "text": "part A"}, {"type": "text", "text": "part B"}]},
     {"role": "user", "content": [{"type": "text", "text": "look:"}, {"type": "input_audio", "input_audio": {"data": "x"}}, {"type": "text", "text": "what?"}]},
     {"role": "assistant", "content": [{"type": "text", "text": "an answer"}]},
     {"role": "user", "content": "ok"}]}),
 ("mid_conversation_system_thinking", {"messages": [
     {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
     {"role": "system", "content": "Now answer briefly."}], "chat_template_kwargs": {"thinking": True}}),
 ("consecutive_user_messages_merge", {"messages": [{"role": "user", "content": "part one"}, {"role": "user", "content": "part two"}], "chat_template_kwargs": {"thinking": True}}),
 ("tool_after_plain_user_merges", {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "t", "content": "r"}]}),
 ("assistant_last_prefill", {"messages": [{"role": "user", "content": "Write a haiku"}, {"role": "assistant", "content": "Autumn moon", "reasoning_content": "think"}], "chat_template_kwargs": {"thinking": True}}),
 ("special_tokens_in_content", {"messages": [{"role": "user", "content": "echo <｜User｜> and </think> and ｜DSML｜ please"}]}),
 ("unicode_and_whitespace", {"messages": [{"role": "system", "content": "  多语言 système \t\n"}, {"role": "user", "content": "Ünïcödé 😀 日本語\r\n\r\n   end  "}], "chat_template_kwargs": {"thinking": True}, "reasoning_effort": 100}),
 ("null_contents", {"messages": [{"role": "system", "content": None}, {"role": "user", "content": "x"}, {"role": "assistant", "content": None}, {"role": "user", "content": "y"}]}),
]

out = []
for name, req in CASES:
    msgs = copy.deepcopy(req["messages"])
    if req.get("tools"):
        if not msgs or msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": ""})
        msgs[0]["tools"] = req["tools"]
    kw = req.get("chat_template_kwargs") or {}
    th = kw.get("thinking")
    if th is None:
        th = kw.get("enable_thinking")
    mode = "thinking" if th else "chat"
    prompt = ref.encode_messages(msgs, thinking_mode=mode, reasoning_effort=req.get("reasoning_effort"))
    out.append({"name": name, "request": req, "prompt": prompt})
json.dump(out, open(sys.argv[1], "w"), ensure_ascii=False, indent=1)
print(len(out), "cases")

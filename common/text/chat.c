/* DeepSeek-V4.1 chat encoding. See chat.h; the steps follow the reference encoder:
 * normalise content parts, merge tool messages into user turns, sort tool results by call
 * order, drop earlier reasoning (thinking mode without tools), render each message. */
#include "common/text/chat.h"

#include "common/alloc.h"
#include "common/text/text_internal.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define THINK_START "<think>"
#define THINK_END "</think>"
#define DSML "｜DSML｜"
#define USER_SP BT_CHAT_USER_TOKEN
#define ASSISTANT_SP "<｜Assistant｜>"
#define SYSTEM_SP "<｜System｜>"
#define LATEST_REMINDER_SP "<｜latest_reminder｜>"
#define IMAGE_SP "<｜deepseek_image｜>"

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL, ROLE_LATEST_REMINDER };
enum { BLOCK_TEXT, BLOCK_TOOL_RESULT, BLOCK_OTHER };

typedef struct {
    int type;
    char *text;        /* text, tool result content, or the unsupported type's name */
    const char *id;    /* tool_use_id (tool results) */
} block_t;

typedef struct {
    int role;
    char *content; /* NULL when null/absent */
    block_t *blocks;
    int n_blocks;
    bool has_blocks; /* content_blocks present (possibly empty) */
    const cJSON *tools;      /* non-empty array or NULL */
    const cJSON *tool_calls; /* non-empty array or NULL */
    char *reasoning;         /* NULL when absent */
    const char *tool_call_id;
    bool wo_eos;
} msg_t;

typedef struct {
    msg_t *v;
    int n, cap;
} msgs_t;

typedef struct {
    char *err;
    size_t errlen;
} ctx_t;

#define BAD(...)                                                                                   \
    do {                                                                                           \
        snprintf(c->err, c->errlen, __VA_ARGS__);                                                  \
        return BT_ERR_BAD_REQUEST;                                                                 \
    } while (0)

static void msgs_push(msgs_t *m, msg_t v)
{
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 8;
        m->v = bt_realloc_or_die(m->v, (size_t)m->cap * sizeof *m->v);
    }
    m->v[m->n++] = v;
}

static void block_push(msg_t *m, block_t b)
{
    m->blocks = bt_realloc_or_die(m->blocks, (size_t)(m->n_blocks + 1) * sizeof *m->blocks);
    m->blocks[m->n_blocks++] = b;
    m->has_blocks = true;
}

static void msg_free(msg_t *m)
{
    for (int i = 0; i < m->n_blocks; i++) free(m->blocks[i].text);
    free(m->blocks);
    free(m->content);
    free(m->reasoning);
}

static void msgs_free(msgs_t *m)
{
    for (int i = 0; i < m->n; i++) msg_free(&m->v[i]);
    free(m->v);
}

/* OpenAI's "developer" role is its newer models' name for system instructions (its SDKs send
 * it for them); the model knows only "system", so it is rendered as one. */
static bool system_role(const char *s)
{
    return !strcmp(s, "system") || !strcmp(s, "developer");
}

static bt_status_t parse_role(ctx_t *c, const cJSON *m, int i, int *role_p)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!cJSON_IsString(r)) BAD("messages[%d].role: missing or not a string", i);
    const char *s = r->valuestring;
    if (system_role(s))
        *role_p = ROLE_SYSTEM;
    else if (!strcmp(s, "user")) *role_p = ROLE_USER;
    else if (!strcmp(s, "assistant")) *role_p = ROLE_ASSISTANT;
    else if (!strcmp(s, "tool")) *role_p = ROLE_TOOL;
    else if (!strcmp(s, "latest_reminder")) *role_p = ROLE_LATEST_REMINDER;
    else BAD("messages[%d].role: unsupported role '%s' for deepseek_v41", i, s);
    return BT_OK;
}

/* One request message -> msg_t: list content becomes blocks (images become the image
 * placeholder text) and content the "\n\n"-joined text of its text blocks. */
static bt_status_t parse_message(ctx_t *c, const cJSON *m, int i, msg_t *out)
{
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(m)) BAD("messages[%d]: not an object", i);
    bt_status_t st = parse_role(c, m, i, &out->role);
    if (st != BT_OK) return st;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(content)) {
        if (strstr(content->valuestring, IMAGE_SP))
            BAD("messages[%d].content: contains the image placeholder token %s", i, IMAGE_SP);
        out->content = bt_strdup_or_die(content->valuestring);
    } else if (cJSON_IsArray(content)) {
        bt__buf_t joined = {0};
        bool first = true;
        const cJSON *part;
        int k = 0;
        cJSON_ArrayForEach(part, content)
        {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const char *ty = cJSON_IsString(type) ? type->valuestring : "None";
            block_t b = {BLOCK_TEXT, NULL, NULL};
            if (!strcmp(ty, "text")) {
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (cJSON_IsString(tx) && strstr(tx->valuestring, IMAGE_SP)) {
                    bt__buf_free(&joined);
                    msg_free(out);
                    BAD("messages[%d].content[%d].text: contains the image placeholder token", i, k);
                }
                b.text = bt_strdup_or_die(cJSON_IsString(tx) ? tx->valuestring : "");
            } else if (!strcmp(ty, "image") || !strcmp(ty, "image_url")) {
                b.text = bt_strdup_or_die(IMAGE_SP);
            } else {
                b.type = BLOCK_OTHER;
                b.text = bt_strdup_or_die(ty);
            }
            if (b.type == BLOCK_TEXT) {
                if (!first) bt__buf_puts(&joined, "\n\n");
                bt__buf_puts(&joined, b.text);
                first = false;
            }
            block_push(out, b);
            k++;
        }
        out->has_blocks = true;
        out->content = bt__buf_take(&joined, NULL);
    } else if (content && !cJSON_IsNull(content)) {
        BAD("messages[%d].content: must be a string, an array of parts or null", i);
    }
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
    if (cJSON_IsString(rc)) {
        if (strstr(rc->valuestring, IMAGE_SP)) {
            msg_free(out);
            BAD("messages[%d].reasoning_content: contains the image placeholder token", i);
        }
        out->reasoning = bt_strdup_or_die(rc->valuestring);
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (cJSON_IsArray(tc) && cJSON_GetArraySize(tc) > 0) {
        const cJSON *call;
        int k = 0;
        cJSON_ArrayForEach(call, tc)
        {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsObject(fn) || !cJSON_IsString(name) ||
                !cJSON_GetObjectItemCaseSensitive(fn, "arguments")) {
                msg_free(out);
                BAD("messages[%d].tool_calls[%d].function: needs a name and arguments", i, k);
            }
            k++;
        }
        out->tool_calls = tc;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
    if (cJSON_IsString(id)) out->tool_call_id = id->valuestring;
    out->wo_eos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "wo_eos"));
    if (out->role == ROLE_TOOL && !content) out->content = bt_strdup_or_die("");
    if (out->role == ROLE_TOOL && cJSON_IsNull(content)) out->content = bt_strdup_or_die("None");
    return BT_OK;
}

/* Tool messages become <tool_result> blocks of a user turn; consecutive user turns merge. */
static void merge_tool_messages(msgs_t *in, msgs_t *out)
{
    for (int i = 0; i < in->n; i++) {
        msg_t *m = &in->v[i];
        msg_t *last = out->n ? &out->v[out->n - 1] : NULL;
        bool last_user = last && last->role == ROLE_USER && last->has_blocks;
        if (m->role == ROLE_TOOL) {
            block_t b = {BLOCK_TOOL_RESULT, m->content, m->tool_call_id};
            m->content = NULL;
            if (last_user) {
                block_push(last, b);
            } else {
                msg_t u = {0};
                u.role = ROLE_USER;
                block_push(&u, b);
                msgs_push(out, u);
            }
            msg_free(m);
        } else if (m->role == ROLE_USER) {
            if (!m->has_blocks) {
                block_t b = {BLOCK_TEXT, bt_strdup_or_die(m->content ? m->content : ""), NULL};
                block_push(m, b);
            }
            if (last_user) {
                for (int k = 0; k < m->n_blocks; k++) block_push(last, m->blocks[k]);
                free(m->blocks);
                m->blocks = NULL;
                m->n_blocks = 0;
                msg_free(m);
            } else {
                m->has_blocks = true;
                msgs_push(out, *m);
            }
        } else {
            msgs_push(out, *m);
        }
        memset(m, 0, sizeof *m);
    }
    in->n = 0;
}

static const char *tool_call_id(const cJSON *call)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(call, "id");
    if (cJSON_IsString(id) && id->valuestring[0]) return id->valuestring;
    id = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(call, "function"), "id");
    if (cJSON_IsString(id) && id->valuestring[0]) return id->valuestring;
    return NULL;
}

/* Position of id among the last assistant turn's tool calls; 0 when unknown (as the
 * reference's dict.get(id, 0)). */
static int call_order(const cJSON *calls, const char *id)
{
    int idx = 0, found = 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, calls)
    {
        const char *cid = tool_call_id(call);
        if (cid && id && !strcmp(cid, id)) found = idx; /* a later duplicate id wins */
        idx++;
    }
    return found;
}

static bool calls_have_ids(const cJSON *calls)
{
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) if (tool_call_id(call)) return true;
    return false;
}

static void sort_tool_results(msgs_t *ms)
{
    const cJSON *calls = NULL;
    for (int i = 0; i < ms->n; i++) {
        msg_t *m = &ms->v[i];
        if (m->role == ROLE_ASSISTANT && m->tool_calls) {
            calls = m->tool_calls;
        } else if (m->role == ROLE_USER && m->n_blocks) {
            int nt = 0;
            for (int k = 0; k < m->n_blocks; k++) nt += m->blocks[k].type == BLOCK_TOOL_RESULT;
            if (nt < 2 || !calls || !calls_have_ids(calls)) continue;
            block_t *tb = bt_malloc_or_die((size_t)nt * sizeof *tb);
            int *key = bt_malloc_or_die((size_t)nt * sizeof *key);
            int j = 0;
            for (int k = 0; k < m->n_blocks; k++)
                if (m->blocks[k].type == BLOCK_TOOL_RESULT) {
                    tb[j] = m->blocks[k];
                    key[j] = call_order(calls, m->blocks[k].id ? m->blocks[k].id : "");
                    j++;
                }
            for (int a = 1; a < nt; a++) { /* stable insertion sort */
                block_t bv = tb[a];
                int kv = key[a], b = a - 1;
                while (b >= 0 && key[b] > kv) {
                    tb[b + 1] = tb[b];
                    key[b + 1] = key[b];
                    b--;
                }
                tb[b + 1] = bv;
                key[b + 1] = kv;
            }
            j = 0;
            for (int k = 0; k < m->n_blocks; k++)
                if (m->blocks[k].type == BLOCK_TOOL_RESULT) m->blocks[k] = tb[j++];
            free(tb);
            free(key);
        }
    }
}

static int last_user_index(const msgs_t *ms)
{
    for (int i = ms->n - 1; i >= 0; i--)
        if (ms->v[i].role == ROLE_USER || (ms->v[i].role == ROLE_SYSTEM && i > 0)) return i;
    return -1;
}

/* Thinking mode without tools: assistant turns before the last user turn lose their
 * reasoning. (Roles other than these five are rejected earlier, so nothing else drops.) */
static void drop_thinking(msgs_t *ms)
{
    int lu = last_user_index(ms);
    for (int i = 0; i < ms->n && i < lu; i++)
        if (ms->v[i].role == ROLE_ASSISTANT) {
            free(ms->v[i].reasoning);
            ms->v[i].reasoning = NULL;
        }
}

/* ---- rendering --------------------------------------------------------------------------- */

static const char TOOLS_TEMPLATE_HEAD[] =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
    "invoke tools by writing a \"<" DSML " calls>\" block like the following:\n\n<" DSML
    " calls>\n<" DSML " invoke name=\"$TOOL_NAME\">\n<" DSML
    " parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML
    " parameter>\n...\n</" DSML " invoke>\n<" DSML " invoke name=\"$TOOL_NAME2\">\n...\n</" DSML
    " invoke>\n</" DSML " calls>\n\nString parameters should be specified as is and set "
    "`string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value "
    "in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by "
    "<think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool "
    "calls or final response.\n\nOtherwise, output directly after </think> with tool calls or "
    "final response.\n\n### Available Tool Schemas\n\n";
static const char TOOLS_TEMPLATE_TAIL[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";

static bt_status_t render_tools(ctx_t *c, bt__buf_t *b, const cJSON *tools)
{
    bt__buf_puts(b, TOOLS_TEMPLATE_HEAD);
    const cJSON *tool;
    int i = 0;
    cJSON_ArrayForEach(tool, tools)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        if (!fn) BAD("tools[%d].function: missing", i);
        if (i) bt__buf_putc(b, '\n');
        bt__json_dump(b, fn);
        i++;
    }
    bt__buf_puts(b, TOOLS_TEMPLATE_TAIL);
    return BT_OK;
}

/* A tool call's arguments as DSML parameters: an object, or a JSON string of one (decoded
 * up to twice); anything else becomes {"arguments": <as given>}. */
static void render_arguments(bt__buf_t *b, const cJSON *args)
{
    cJSON *owned[2] = {NULL, NULL};
    const cJSON *obj = args;
    for (int k = 0; k < 2 && cJSON_IsString(obj); k++) {
        cJSON *p = bt__json_parse(obj->valuestring, strlen(obj->valuestring));
        if (!p) break;
        owned[k] = p;
        obj = p;
    }
    bool first = true;
    if (cJSON_IsObject(obj)) {
        const cJSON *kv;
        cJSON_ArrayForEach(kv, obj)
        {
            if (!first) bt__buf_putc(b, '\n');
            first = false;
            bool is_str = cJSON_IsString(kv);
            bt__buf_printf(b, "<" DSML " parameter name=\"%s\" string=\"%s\">", kv->string,
                           is_str ? "true" : "false");
            if (is_str)
                bt__buf_puts(b, kv->valuestring);
            else
                bt__json_dump(b, kv);
            bt__buf_puts(b, "</" DSML " parameter>");
        }
    } else {
        bool is_str = cJSON_IsString(args);
        bt__buf_printf(b, "<" DSML " parameter name=\"arguments\" string=\"%s\">",
                       is_str ? "true" : "false");
        if (is_str)
            bt__buf_puts(b, args->valuestring);
        else
            bt__json_dump(b, args);
        bt__buf_puts(b, "</" DSML " parameter>");
    }
    cJSON_Delete(owned[0]);
    cJSON_Delete(owned[1]);
}

static bt_status_t render_message(ctx_t *c, bt__buf_t *b, const msgs_t *ms, int index,
                                  bool thinking, bool drop, int effort)
{
    const msg_t *m = &ms->v[index];
    int lu = last_user_index(ms);
    bool effort_line = index == 0 && thinking;
    if (index == 0 && (effort_line || m->role == ROLE_SYSTEM)) bt__buf_puts(b, SYSTEM_SP);
    if (effort_line)
        bt__buf_printf(b,
                       "Reasoning Effort: %d (range 1-100, the higher the value, the more "
                       "thorough the reasoning)\n\n",
                       effort);
    switch (m->role) {
    case ROLE_SYSTEM:
        if (index > 0) bt__buf_puts(b, SYSTEM_SP);
        bt__buf_puts(b, m->content ? m->content : "");
        if (m->tools) {
            bt__buf_puts(b, "\n\n");
            bt_status_t st = render_tools(c, b, m->tools);
            if (st != BT_OK) return st;
        }
        break;
    case ROLE_USER:
        bt__buf_puts(b, USER_SP);
        if (m->n_blocks) {
            for (int k = 0; k < m->n_blocks; k++) {
                const block_t *bl = &m->blocks[k];
                if (k) bt__buf_puts(b, "\n\n");
                if (bl->type == BLOCK_TEXT) {
                    bt__buf_puts(b, bl->text ? bl->text : "");
                } else if (bl->type == BLOCK_TOOL_RESULT) {
                    bt__buf_puts(b, "<tool_result>");
                    bt__buf_puts(b, bl->text ? bl->text : "");
                    bt__buf_puts(b, "</tool_result>");
                } else {
                    bt__buf_printf(b, "[Unsupported %s]", bl->text);
                }
            }
        } else {
            bt__buf_puts(b, m->content ? m->content : "");
        }
        break;
    case ROLE_LATEST_REMINDER:
        bt__buf_puts(b, LATEST_REMINDER_SP);
        bt__buf_puts(b, m->content ? m->content : "");
        break;
    case ROLE_ASSISTANT:
        if (thinking && (!drop || index > lu)) {
            bt__buf_puts(b, m->reasoning ? m->reasoning : "");
            bt__buf_puts(b, THINK_END);
        }
        bt__buf_puts(b, m->content ? m->content : "");
        if (m->tool_calls) {
            bt__buf_puts(b, "\n\n<" DSML " calls>\n");
            const cJSON *call;
            bool first = true;
            cJSON_ArrayForEach(call, m->tool_calls)
            {
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
                if (!first) bt__buf_putc(b, '\n');
                first = false;
                bt__buf_printf(b, "<" DSML " invoke name=\"%s\">\n",
                               cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
                render_arguments(b, cJSON_GetObjectItemCaseSensitive(fn, "arguments"));
                bt__buf_puts(b, "\n</" DSML " invoke>");
            }
            bt__buf_puts(b, "\n</" DSML " calls>");
        }
        if (!m->wo_eos) bt__buf_puts(b, EOS);
        break;
    default: BAD("internal: tool message left after merging");
    }
    if (index + 1 < ms->n && ms->v[index + 1].role != ROLE_ASSISTANT &&
        ms->v[index + 1].role != ROLE_LATEST_REMINDER)
        return BT_OK;
    if (m->role == ROLE_USER || (m->role == ROLE_SYSTEM && index > 0)) {
        bt__buf_puts(b, ASSISTANT_SP);
        if (thinking && (!drop || index >= lu))
            bt__buf_puts(b, THINK_START);
        else
            bt__buf_puts(b, THINK_END);
    }
    return BT_OK;
}

/* thinking from chat_template_kwargs.thinking, its alias chat_template_kwargs.enable_thinking
 * ("thinking" wins), else a top-level enable_thinking (as some OpenAI-style APIs take it) */
static bt_status_t parse_thinking(ctx_t *c, const cJSON *req, bool *thinking_p)
{
    *thinking_p = false;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs");
    if (kw && !cJSON_IsNull(kw) && !cJSON_IsObject(kw))
        BAD("chat_template_kwargs: must be an object");
    const cJSON *v = NULL;
    const char *name = "chat_template_kwargs.thinking";
    if (cJSON_IsObject(kw)) {
        v = cJSON_GetObjectItemCaseSensitive(kw, "thinking");
        if (!v || cJSON_IsNull(v))
            v = cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking"),
            name = "chat_template_kwargs.enable_thinking";
    }
    if (!v || cJSON_IsNull(v))
        v = cJSON_GetObjectItemCaseSensitive(req, "enable_thinking"), name = "enable_thinking";
    if (!v || cJSON_IsNull(v)) return BT_OK;
    if (cJSON_IsBool(v))
        *thinking_p = cJSON_IsTrue(v);
    else if (cJSON_IsNumber(v))
        *thinking_p = v->valuedouble != 0;
    else
        BAD("%s: must be a boolean", name);
    return BT_OK;
}

bt_status_t bt_chat_thinking(const cJSON *request, bool *thinking_p, char *err, size_t errlen)
{
    char dummy[1];
    ctx_t cx = {err ? err : dummy, err ? errlen : sizeof dummy};
    if (!request || !thinking_p) return BT_ERR_INVALID_ARG;
    return parse_thinking(&cx, request, thinking_p);
}

static bt_status_t parse_effort(ctx_t *c, const cJSON *req, int *effort_p)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, "reasoning_effort");
    if (!v || cJSON_IsNull(v))
        v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs"),
                                             "reasoning_effort");
    *effort_p = 75; /* "high" */
    if (!v || cJSON_IsNull(v)) return BT_OK;
    if (cJSON_IsString(v)) {
        if (!strcmp(v->valuestring, "low")) *effort_p = 50;
        else if (!strcmp(v->valuestring, "high")) *effort_p = 75;
        else if (!strcmp(v->valuestring, "max")) *effort_p = 100;
        else BAD("reasoning_effort: '%s' is not one of low, high, max or an integer 1..100", v->valuestring);
        return BT_OK;
    }
    if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 100 &&
        v->valuedouble == (double)(int)v->valuedouble &&
        !(v->valuestring && strpbrk(v->valuestring, ".eE"))) {
        *effort_p = (int)v->valuedouble;
        return BT_OK;
    }
    BAD("reasoning_effort: must be low, high, max or an integer 1..100");
}

cJSON *bt_chat_parse_request(const char *json, size_t len)
{
    return bt__json_parse(json, len);
}

bt_status_t bt_chat_render(const cJSON *req, char **prompt_p, size_t *len_p, char *err,
                           size_t errlen)
{
    char dummy[1];
    ctx_t cx = {err ? err : dummy, err ? errlen : sizeof dummy}, *c = &cx;
    if (!req || !prompt_p) return BT_ERR_INVALID_ARG;
    if (!cJSON_IsObject(req)) BAD("request: must be a JSON object");
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!cJSON_IsArray(messages)) BAD("messages: missing or not an array");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools)) BAD("tools: must be an array");
    bool thinking;
    int effort;
    bt_status_t st = parse_thinking(c, req, &thinking);
    if (st != BT_OK) return st;
    st = parse_effort(c, req, &effort);
    if (st != BT_OK) return st;

    msgs_t raw = {0}, ms = {0};
    bt__buf_t b = {0};
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) {
        const cJSON *first = cJSON_GetArrayItem(messages, 0);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(first, "role");
        if (!cJSON_IsString(role) || !system_role(role->valuestring)) {
            msg_t sys = {0};
            sys.role = ROLE_SYSTEM;
            sys.content = bt_strdup_or_die("");
            msgs_push(&raw, sys);
        }
    }
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages)
    {
        msg_t one;
        st = parse_message(c, m, i++, &one);
        if (st != BT_OK) goto cleanup;
        msgs_push(&raw, one);
    }
    if (raw.n == 0) {
        snprintf(c->err, c->errlen, "messages: empty");
        st = BT_ERR_BAD_REQUEST;
        goto cleanup;
    }
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) raw.v[0].tools = tools;

    bool drop = true;
    for (int k = 0; k < raw.n; k++)
        if (raw.v[k].tools) drop = false;
    merge_tool_messages(&raw, &ms);
    sort_tool_results(&ms);
    if (thinking && drop) drop_thinking(&ms);

    bt__buf_puts(&b, BOS);
    for (int k = 0; k < ms.n; k++) {
        st = render_message(c, &b, &ms, k, thinking, drop, effort);
        if (st != BT_OK) goto cleanup;
    }
    *prompt_p = bt__buf_take(&b, len_p);
cleanup:
    bt__buf_free(&b);
    msgs_free(&raw);
    msgs_free(&ms);
    return st;
}

bt_status_t bt_chat_encode(const bt_tokenizer_t *tok, const cJSON *request, int32_t **ids_p,
                           size_t *n_p, char *err, size_t errlen)
{
    char *prompt;
    size_t len;
    bt_status_t st = bt_chat_render(request, &prompt, &len, err, errlen);
    if (st != BT_OK) return st;
    st = bt_tokenizer_encode(tok, prompt, len, 0, ids_p, n_p);
    free(prompt);
    return st;
}

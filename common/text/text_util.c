/* Buffer, UTF-8 and Python-compatible JSON output helpers for common/text. */
#include "common/text/text_internal.h"

#include "common/alloc.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffer ------------------------------------------------------------------------------ */

void bt__buf_reserve(bt__buf_t *b, size_t extra)
{
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    b->data = bt_realloc_or_die(b->data, cap);
    b->cap = cap;
    b->data[b->len] = '\0';
}

void bt__buf_append(bt__buf_t *b, const void *p, size_t n)
{
    bt__buf_reserve(b, n);
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void bt__buf_puts(bt__buf_t *b, const char *s)
{
    bt__buf_append(b, s, strlen(s));
}

void bt__buf_putc(bt__buf_t *b, char c)
{
    bt__buf_reserve(b, 1);
    b->data[b->len++] = c;
    b->data[b->len] = '\0';
}

void bt__buf_printf(bt__buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        bt__buf_append(b, tmp, (size_t)n);
        return;
    }
    bt__buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *bt__buf_take(bt__buf_t *b, size_t *len_p)
{
    if (!b->data) bt__buf_reserve(b, 0), b->data[0] = '\0';
    char *p = b->data;
    if (len_p) *len_p = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

void bt__buf_free(bt__buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- UTF-8 ------------------------------------------------------------------------------- */

/* Bounds of the second byte of a sequence led by `lead` (Unicode Table 3-7), 0 if lead is
 * not a valid leading byte. */
static int seq_len(uint8_t lead, uint8_t *lo_p, uint8_t *hi_p)
{
    *lo_p = 0x80;
    *hi_p = 0xBF;
    if (lead < 0x80) return 1;
    if (lead < 0xC2) return 0;
    if (lead < 0xE0) return 2;
    if (lead < 0xF0) {
        if (lead == 0xE0) *lo_p = 0xA0;
        if (lead == 0xED) *hi_p = 0x9F;
        return 3;
    }
    if (lead < 0xF5) {
        if (lead == 0xF0) *lo_p = 0x90;
        if (lead == 0xF4) *hi_p = 0x8F;
        return 4;
    }
    return 0;
}

/* Number of bytes of a valid prefix at s (how far a well-formed sequence got), and the
 * sequence length expected. */
static int valid_prefix(const uint8_t *s, size_t n, int *want_p)
{
    uint8_t lo, hi;
    int want = seq_len(s[0], &lo, &hi);
    *want_p = want;
    if (want <= 1) return want;
    int got = 1;
    for (int k = 1; k < want && (size_t)k < n; k++) {
        uint8_t c = s[k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
        got++;
    }
    return got;
}

int bt__utf8_decode(const uint8_t *s, size_t n, uint32_t *cp_p)
{
    if (n == 0) return 0;
    int want;
    int got = valid_prefix(s, n, &want);
    if (want == 0 || got != want) return 0;
    uint32_t cp;
    switch (want) {
    case 1: cp = s[0]; break;
    case 2: cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); break;
    case 3: cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); break;
    default:
        cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
             ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        break;
    }
    if (cp_p) *cp_p = cp;
    return want;
}

void bt__utf8_put(bt__buf_t *b, uint32_t cp)
{
    char t[4];
    size_t n;
    if (cp < 0x80) {
        t[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    bt__buf_append(b, t, n);
}

bool bt__utf8_valid(const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = bt__utf8_decode(u + i, n - i, NULL);
        if (!k) return false;
        i += (size_t)k;
    }
    return true;
}

size_t bt__utf8_lossy(bt__buf_t *out, const uint8_t *s, size_t n, bool final)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    bt__buf_reserve(out, n);
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int want;
        int got = valid_prefix(s + i, n - i, &want);
        if (want > 1 && got == want) {
            i += (size_t)want;
            continue;
        }
        /* ill-formed or truncated at i */
        if (want > 1 && i + (size_t)got == n && !final) break; /* may complete later */
        bt__buf_append(out, s + run, i - run);
        bt__buf_append(out, fffd, 3);
        i += got > 0 ? (size_t)got : 1;
        run = i;
    }
    bt__buf_append(out, s + run, i - run);
    return i;
}

/* ---- JSON -------------------------------------------------------------------------------- */

/* Walks the text's number tokens and the tree's number items in document order together. */
typedef struct {
    const char *p, *end;
} scan_t;

static bool next_number(scan_t *sc, const char **start_p, size_t *len_p)
{
    const char *p = sc->p;
    while (p < sc->end) {
        char c = *p;
        if (c == '"') {
            p++;
            while (p < sc->end && *p != '"') p += (*p == '\\') ? 2 : 1;
            p++;
            continue;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            const char *s = p;
            p++;
            while (p < sc->end && (strchr("0123456789.eE+-", *p) != NULL)) p++;
            *start_p = s;
            *len_p = (size_t)(p - s);
            sc->p = p;
            return true;
        }
        p++;
    }
    sc->p = p;
    return false;
}

static void attach_lexemes(cJSON *item, scan_t *sc)
{
    for (; item; item = item->next) {
        if (cJSON_IsNumber(item)) {
            const char *s;
            size_t n;
            if (next_number(sc, &s, &n) && !item->valuestring) {
                char *lex = malloc(n + 1); /* freed by cJSON_Delete */
                if (lex) {
                    memcpy(lex, s, n);
                    lex[n] = '\0';
                    item->valuestring = lex;
                }
            }
        }
        if (item->child) attach_lexemes(item->child, sc);
    }
}

cJSON *bt__json_parse(const char *text, size_t len)
{
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) return NULL;
    scan_t sc = {text, text + len};
    attach_lexemes(root, &sc);
    return root;
}

void bt__json_dump_string(bt__buf_t *b, const char *s)
{
    bt__buf_putc(b, '"');
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        const char *esc = NULL;
        char tmp[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                esc = tmp;
            }
        }
        if (esc) {
            bt__buf_append(b, run, (size_t)(s - run));
            bt__buf_puts(b, esc);
            run = s + 1;
        }
    }
    bt__buf_append(b, run, (size_t)(s - run));
    bt__buf_putc(b, '"');
}

void bt__json_dump_float(bt__buf_t *b, double v)
{
    if (isnan(v)) {
        bt__buf_puts(b, "NaN");
        return;
    }
    if (isinf(v)) {
        bt__buf_puts(b, v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (v == 0) {
        bt__buf_puts(b, signbit(v) ? "-0.0" : "0.0");
        return;
    }
    /* shortest round-tripping digits */
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    const char *p = e;
    bool neg = false;
    if (*p == '-') neg = true, p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int exp10 = atoi(p + 1);
    int decpt = exp10 + 1; /* value = 0.d1d2.. * 10^decpt */
    if (neg) bt__buf_putc(b, '-');
    if (decpt > 16 || decpt < -3) {
        bt__buf_putc(b, digits[0]);
        if (nd > 1) {
            bt__buf_putc(b, '.');
            bt__buf_append(b, digits + 1, (size_t)(nd - 1));
        }
        bt__buf_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        bt__buf_puts(b, "0.");
        for (int i = 0; i < -decpt; i++) bt__buf_putc(b, '0');
        bt__buf_append(b, digits, (size_t)nd);
    } else {
        for (int i = 0; i < decpt; i++) bt__buf_putc(b, i < nd ? digits[i] : '0');
        bt__buf_putc(b, '.');
        if (nd > decpt)
            bt__buf_append(b, digits + decpt, (size_t)(nd - decpt));
        else
            bt__buf_putc(b, '0');
    }
}

static void dump_number(bt__buf_t *b, const cJSON *item)
{
    const char *lex = item->valuestring;
    if (lex && *lex) {
        if (!strpbrk(lex, ".eE")) { /* an int: Python keeps it exactly */
            const char *d = lex[0] == '-' ? lex + 1 : lex;
            bool zero = true;
            for (const char *q = d; *q; q++)
                if (*q != '0') zero = false;
            bt__buf_puts(b, zero ? "0" : lex);
            return;
        }
        bt__json_dump_float(b, strtod(lex, NULL));
        return;
    }
    double v = item->valuedouble;
    if (v == floor(v) && fabs(v) < 9007199254740992.0)
        bt__buf_printf(b, "%.0f", v);
    else
        bt__json_dump_float(b, v);
}

void bt__json_dump(bt__buf_t *b, const cJSON *item)
{
    if (!item) {
        bt__buf_puts(b, "null");
        return;
    }
    switch (item->type & 0xFF) {
    case cJSON_NULL: bt__buf_puts(b, "null"); break;
    case cJSON_False: bt__buf_puts(b, "false"); break;
    case cJSON_True: bt__buf_puts(b, "true"); break;
    case cJSON_Number: dump_number(b, item); break;
    case cJSON_String: bt__json_dump_string(b, item->valuestring ? item->valuestring : ""); break;
    case cJSON_Raw: bt__buf_puts(b, item->valuestring ? item->valuestring : "null"); break;
    case cJSON_Array: {
        bt__buf_putc(b, '[');
        for (const cJSON *c = item->child; c; c = c->next) {
            bt__json_dump(b, c);
            if (c->next) bt__buf_puts(b, ", ");
        }
        bt__buf_putc(b, ']');
        break;
    }
    case cJSON_Object: {
        bt__buf_putc(b, '{');
        for (const cJSON *c = item->child; c; c = c->next) {
            bt__json_dump_string(b, c->string ? c->string : "");
            bt__buf_puts(b, ": ");
            bt__json_dump(b, c);
            if (c->next) bt__buf_puts(b, ", ");
        }
        bt__buf_putc(b, '}');
        break;
    }
    default: bt__buf_puts(b, "null"); break;
    }
}

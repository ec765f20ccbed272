/* baton: the operator's command. */
#include "services/cli/cli.h"

#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"up", bt_cli_up, "start a local cluster: router, prefill, decode (and gateway)"},
    {"complete", bt_cli_complete, "call the router's Generate over gRPC"},
    {"bench", bt_cli_bench, "load test the gateway (HTTP) or the router (gRPC); JSON and plots"},
    {"recipe", bt_cli_recipe, "recipe apply SOURCE: map a published recipe onto a cluster config"},
    {"doctor", bt_cli_doctor, "check this host against what a cluster config needs"},
    {"generate", bt_cli_generate, "greedy or sampled generation in one process (no services)"},
    {"logits", bt_cli_logits, "write float32 logits for every input position"},
    {"make-demo-model", bt_cli_make_demo_model, "write a tiny untrained demo checkpoint"},
    {"tokenize", bt_cli_tokenize, "text on stdin -> comma-separated ids"},
    {"detokenize", bt_cli_detokenize, "ids on stdin -> text"},
    {"chat-encode", bt_cli_chat_encode, "OpenAI request JSON on stdin -> prompt ids"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: baton COMMAND [flags]   (baton COMMAND --help for its flags)\n\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-16s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv)
{
    bt_log_set_tag("baton");
    const char *lvl = getenv("BT_LOG_LEVEL");
    if (lvl && bt_log_level_parse(lvl) >= 0) bt_log_set_level((bt_log_level_t)bt_log_level_parse(lvl));
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 2, argv + 2);
    fprintf(stderr, "baton: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

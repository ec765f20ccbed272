/* Placeholder until common/text lands: the text commands report that they are missing. */
#include "services/cli/cli.h"

#include <stdio.h>

static int missing(const char *name)
{
    fprintf(stderr, "baton %s: not built yet (common/text is in progress)\n", name);
    return 1;
}

int bt_cli_tokenize(int argc, char **argv)
{
    return missing("tokenize");
}

int bt_cli_detokenize(int argc, char **argv)
{
    return missing("detokenize");
}

int bt_cli_chat_encode(int argc, char **argv)
{
    return missing("chat-encode");
}

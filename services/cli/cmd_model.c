/* baton generate / logits / make-demo-model (engine in one process). */
#include "services/cli/cli.h"

#include <stdio.h>

int bt_cli_generate(int argc, char **argv)
{
    fprintf(stderr, "baton generate: engine in progress\n");
    return 1;
}

int bt_cli_logits(int argc, char **argv)
{
    fprintf(stderr, "baton logits: engine in progress\n");
    return 1;
}

int bt_cli_make_demo_model(int argc, char **argv)
{
    fprintf(stderr, "baton make-demo-model: engine in progress\n");
    return 1;
}

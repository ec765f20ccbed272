/* libFuzzer target: recipe parsing (a recipe is fetched from outside): the JSON document, the
 * shell-word split of its command, the env scan, and the rendered config, which must always
 * read back through the config parser. The config parser is fed the raw bytes too. */
#include "services/cli/config.c"
#include "services/cli/recipe.c"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    bt_recipe_t *r = NULL;
    if (bt_recipe_parse((const char *)data, size, &r, err, sizeof err) == BT_OK) {
        char *text = bt_recipe_render_config(r, "fuzz");
        bt_conf_t *c = NULL;
        if (bt_conf_parse(text, strlen(text), "rendered", &c, err, sizeof err) != BT_OK) __builtin_trap();
        bt_conf_destroy(c);
        free(text);
        free(bt_recipe_report_json(r));
        bt_recipe_destroy(r);
    }
    bt_conf_t *c = NULL;
    if (bt_conf_parse((const char *)data, size, "fuzz", &c, err, sizeof err) == BT_OK) bt_conf_destroy(c);
    return 0;
}

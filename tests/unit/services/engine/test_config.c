/* config.json parsing: the golden configs load with the right derived roles; malformed
 * values are refused naming the field (o_groups 0 once divided by zero; a value past int
 * range once wrapped before the range check; an array's entry past int64 range was converted
 * regardless, undefined behaviour the config fuzzer's UBSan reported). */
#include "bt_test.h"
#include "services/engine/config.h"

#include <string.h>

static const char base[] =
    "{\"text_config\": {\"vocab_size\": 100, \"hidden_size\": 32, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 4, \"head_dim\": 16, \"q_lora_rank\": 8, \"o_groups\": %s,"
    " \"o_lora_rank\": 8, \"index_n_heads\": 2, \"index_head_dim\": 8, \"index_topk\": 4,"
    " \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8,"
    " \"qk_rope_head_dim\": 8, \"compress_ratios\": [0, 2, 2, 1],"
    " \"kv_source_layer_ids\": [1, 3], \"index_source_layer_ids\": [1, 3],"
    " \"candidate_source_layer_id\": 3}}";

static bt_status_t parse_with(const char *o_groups, bt_model_config_t *c, char *err, size_t n)
{
    char json[2048];
    snprintf(json, sizeof json, base, o_groups);
    return bt_model_config_parse(json, strlen(json), c, err, n);
}

static void test_roles(void)
{
    bt_model_config_t c;
    char err[256];
    BT_CHECK_MSG(parse_with("2", &c, err, sizeof err) == BT_OK, "%s", err);
    BT_CHECK_EQ_INT(c.layer[2].kv_source, 1);
    BT_CHECK_EQ_INT(c.layer[3].kv_source, 3);
    BT_CHECK_EQ_INT(c.layer[3].index_key_owner, 3);
    BT_CHECK_EQ_INT(c.layer[0].kv_source, -1);
    BT_CHECK(c.rope_compress.yarn == false); /* flat config without rope_scaling */
    BT_CHECK_EQ_INT(c.rope_main.rope_dim, 8);
}

static void test_bad_values(void)
{
    bt_model_config_t c;
    char err[256];
    BT_CHECK(parse_with("0", &c, err, sizeof err) == BT_ERR_BAD_CONFIG);
    BT_CHECK(strstr(err, "o_groups") != NULL);
    BT_CHECK(parse_with("3", &c, err, sizeof err) == BT_ERR_BAD_CONFIG); /* does not divide 4 */
    BT_CHECK(strstr(err, "o_groups") != NULL);
    BT_CHECK(parse_with("4294967298", &c, err, sizeof err) == BT_ERR_BAD_CONFIG); /* wraps to 2 */
    BT_CHECK(strstr(err, "o_groups") != NULL);
    BT_CHECK(parse_with("\"2\"", &c, err, sizeof err) == BT_ERR_BAD_CONFIG);
    BT_CHECK(strstr(err, "o_groups") != NULL);
    BT_CHECK(bt_model_config_parse("{", 1, &c, err, sizeof err) == BT_ERR_BAD_CONFIG);
    char json[2048];
    snprintf(json, sizeof json, base, "2");
    char *at = strstr(json, "[0, 2, 2, 1]");
    memcpy(at, "[0,2,2,1e34]", 12);
    BT_CHECK(bt_model_config_parse(json, strlen(json), &c, err, sizeof err) == BT_ERR_BAD_CONFIG);
    BT_CHECK_MSG(strstr(err, "compress_ratios") != NULL, "%s", err);
}

int main(void)
{
    BT_RUN(test_roles);
    BT_RUN(test_bad_values);
    return bt_test_summary();
}

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

/* DSpark's keys: the released names or the reference code's (n_mtp_layers,
 * dspark_n_activated_experts); target layers in layer order, each once (as the reference
 * concatenates the captured streams); bad values refused naming the field. */
static void test_draft(void)
{
    static const char draft[] =
        "{\"vocab_size\": 100, \"hidden_size\": 32, \"num_hidden_layers\": 4, "
        "\"num_attention_heads\": 4,"
        " \"head_dim\": 16, \"q_lora_rank\": 8, \"o_groups\": 2, \"o_lora_rank\": 8, "
        "\"index_n_heads\": 2,"
        " \"index_head_dim\": 8, \"index_topk\": 4, \"n_routed_experts\": 4, "
        "\"num_experts_per_tok\": 2,"
        " \"moe_intermediate_size\": 8, \"qk_rope_head_dim\": 8, \"compress_ratios\": [0, 2, 2, 1, "
        "%s],"
        " \"kv_source_layer_ids\": [1, 3], \"index_source_layer_ids\": [1, 3], \"%s\": 2,"
        " \"dspark_block_size\": 5, \"dspark_noise_token_id\": %s, \"dspark_target_layer_ids\": "
        "[%s],"
        " \"dspark_n_routed_experts\": 3, \"%s\": %s}";
    char json[2048], err[256];
    bt_model_config_t c;
    struct {
        const char *ratios, *stages, *noise, *targets, *active_key, *active, *bad;
    } cases[] = {
        {"0, 0", "num_nextn_predict_layers", "99", "3, 1, 3", "dspark_num_experts_per_tok", "2",
         NULL},
        {"0, 0", "n_mtp_layers", "99", "2", "dspark_n_activated_experts", "1", NULL},
        {"0, 2", "num_nextn_predict_layers", "99", "1", "dspark_num_experts_per_tok", "2",
         "compress_ratios"},
        {"0, 0", "num_nextn_predict_layers", "100", "1", "dspark_num_experts_per_tok", "2",
         "dspark_noise_token_id"},
        {"0, 0", "num_nextn_predict_layers", "99", "4", "dspark_num_experts_per_tok", "2",
         "dspark_target_layer_ids"},
        {"0, 0", "n_mtp_layers", "99", "1", "dspark_n_activated_experts", "4",
         "dspark_n_activated_experts"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        snprintf(json, sizeof json, draft, cases[k].ratios, cases[k].stages, cases[k].noise,
                 cases[k].targets, cases[k].active_key, cases[k].active);
        bt_status_t st = bt_model_config_parse(json, strlen(json), &c, err, sizeof err);
        if (cases[k].bad) {
            BT_CHECK_MSG(st == BT_ERR_BAD_CONFIG && strstr(err, cases[k].bad), "case %zu: %s", k,
                         err);
            continue;
        }
        BT_CHECK_MSG(st == BT_OK, "case %zu: %s", k, err);
        BT_CHECK_EQ_INT(c.n_draft, 2);
        BT_CHECK_EQ_INT(c.draft_block, 5);
        BT_CHECK_EQ_INT(c.draft_experts, 3);
        BT_CHECK_EQ_INT(c.draft_active, k == 0 ? 2 : 1);
        BT_CHECK_EQ_INT(c.layer[5].compress_ratio, 0);
        BT_CHECK_EQ_INT(c.layer[5].kv_source, -1);
    }
    snprintf(json, sizeof json, draft, "0, 0", "num_nextn_predict_layers", "99", "3, 1, 3",
             "dspark_num_experts_per_tok", "2");
    BT_CHECK(bt_model_config_parse(json, strlen(json), &c, err, sizeof err) == BT_OK);
    BT_CHECK(c.n_draft_targets == 2 && c.draft_targets[0] == 1 && c.draft_targets[1] == 3);
}

int main(void)
{
    BT_RUN(test_roles);
    BT_RUN(test_bad_values);
    BT_RUN(test_draft);
    return bt_test_summary();
}

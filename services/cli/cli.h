/* `baton` subcommands. Each takes the arguments after its name and returns the process exit
 * code (0 ok, 1 failure, 2 usage error). */
#ifndef BT_CLI_H
#define BT_CLI_H

int bt_cli_generate(int argc, char **argv);
int bt_cli_logits(int argc, char **argv);
int bt_cli_make_demo_model(int argc, char **argv);
int bt_cli_tokenize(int argc, char **argv);
int bt_cli_detokenize(int argc, char **argv);
int bt_cli_chat_encode(int argc, char **argv);
int bt_cli_up(int argc, char **argv);
int bt_cli_complete(int argc, char **argv);
int bt_cli_bench(int argc, char **argv);
int bt_cli_recipe(int argc, char **argv);
int bt_cli_doctor(int argc, char **argv);

#endif

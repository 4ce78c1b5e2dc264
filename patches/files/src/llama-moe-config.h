#pragma once

// llama_moe's environment variables, read in one place and strictly: a value that is not what the variable
// takes is replaced by the default with a warning that names the variable, the value and what is used.

#include <cstdint>

// unset (or empty): def; else the whole value must be a decimal integer from lo to hi
int64_t llama_moe_env_int(const char * name, int64_t def, int64_t lo, int64_t hi);

// unset (or empty): def; else 1/0, true/false, on/off or yes/no (any case)
bool llama_moe_env_flag(const char * name, bool def);

// unset (or empty): def; else the whole value must be a number from lo to hi
float llama_moe_env_float(const char * name, float def, float lo, float hi);

// the raw value, nullptr when unset or empty
const char * llama_moe_env_str(const char * name);

// Test switches: they make the engine misbehave or pretend on purpose, so that tests can reach its failure paths
// on any machine. Never for use in production; each one in use is said in the log by what reads it.
struct llama_moe_test_switches {
    int     mailbox_stall_il = -1;    // LLAMA_MOE_MAILBOX_TEST_STALL: the mailbox leaves this layer unanswered until a decode fails
    int     mailbox_delay_us = 0;     // LLAMA_MOE_MAILBOX_TEST_DELAY_US: the mailbox's CPU side waits before each record it reads
    bool    mailbox_empty    = false; // LLAMA_MOE_MAILBOX_TEST_EMPTY: the mailbox answers without computing (wrong output)
    int64_t device_free_kib  = -1;    // LLAMA_MOE_TEST_DEVICE_FREE_KIB: the cache device's free memory, as if measured
};

// reads the test switches (each by the rules above); a default where unset
llama_moe_test_switches llama_moe_test_switches_read();

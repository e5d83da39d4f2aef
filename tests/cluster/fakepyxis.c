/*
 * fakepyxis.c - SPANK plugin standing in for NVIDIA Pyxis on the local test cluster.
 *
 * Built and registered by tests/cluster/harness.py (gcc against <slurm/spank.h> from libslurm-dev),
 * listed in /etc/slurm/plugstack.conf.d/fakepyxis.conf as
 *     required /usr/local/lib/slurm/fakepyxis.so registry_log=<state>/evidence/pyxis-registry-images.log
 *
 * What it does:
 * - In every context (srun, sbatch/salloc, slurmstepd, slurmd) it registers Pyxis' command-line
 *   options, so `srun`, `sbatch` and `#SBATCH` lines accept them. Slurm itself carries options given
 *   to sbatch into the job environment (SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_*): they apply to the
 *   batch step AND every srun step inside the job; an option on srun's own command line wins.
 * - In the step on the node (remote context, user_init, running as the job user):
 *   a PATH image (starts with '/') must exist and start with the squashfs magic "hsqs";
 *   a REGISTRY image (anything else) is what a GPU job must never use: it is recorded, one line per
 *   step (job, step, node, image), in the registry_log evidence file and the step goes on;
 *   every --container-mounts source that is an absolute path must exist.
 *   A failed check prints a Pyxis-like "pyxis: [ERROR] ..." message and, as real Pyxis does, fails
 *   every task of the step in task_init (exit code 1: srun and the job fail).
 *   The values are exported to the tasks as PYXIS_CONTAINER_IMAGE, PYXIS_CONTAINER_MOUNTS,
 *   PYXIS_CONTAINER_WORKDIR and PYXIS_CONTAINER_NAME.
 * - In each task (task_init) it changes to --container-workdir when that directory exists.
 * The command itself runs on the host: there is no container.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(pyxis, 1);

enum value_option { OPT_IMAGE, OPT_MOUNTS, OPT_WORKDIR, OPT_NAME, OPT_SAVE, OPT_ENV, N_VALUES };

static char *values[N_VALUES];
static const char *registry_log;
static int step_failed;

static int store_value(int val, const char *optarg, int remote)
{
    (void) remote;
    if (val < 0 || val >= N_VALUES || optarg == NULL)
        return -1;
    free(values[val]);
    values[val] = strdup(optarg);
    return values[val] == NULL ? -1 : 0;
}

static int accept_flag(int val, const char *optarg, int remote)
{
    (void) val;
    (void) optarg;
    (void) remote;
    return 0;
}

static struct spank_option options[] = {
    {"container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
     "[pyxis] the image to use for the container filesystem: an enroot URI or a squashfs file path",
     1, OPT_IMAGE, store_value},
    {"container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]",
     "[pyxis] bind mount[s] inside the container", 1, OPT_MOUNTS, store_value},
    {"container-workdir", "PATH", "[pyxis] working directory inside the container", 1, OPT_WORKDIR,
     store_value},
    {"container-name", "NAME", "[pyxis] name to use for saving and loading the container", 1,
     OPT_NAME, store_value},
    {"container-save", "PATH", "[pyxis] save the container state to a squashfs file", 1, OPT_SAVE,
     store_value},
    {"container-env", "NAME[,NAME...]",
     "[pyxis] names of environment variables to override with the host value", 1, OPT_ENV,
     store_value},
    {"container-mount-home", NULL, "[pyxis] bind mount the user's home directory", 0, 0, accept_flag},
    {"no-container-mount-home", NULL, "[pyxis] do not bind mount the user's home directory", 0, 0,
     accept_flag},
    {"container-remap-root", NULL, "[pyxis] ask to be remapped to root inside the container", 0, 0,
     accept_flag},
    {"no-container-remap-root", NULL, "[pyxis] do not remap to root inside the container", 0, 0,
     accept_flag},
    {"container-writable", NULL, "[pyxis] make the container filesystem writable", 0, 0, accept_flag},
    {"container-readonly", NULL, "[pyxis] make the container filesystem read-only", 0, 0, accept_flag},
    {"container-entrypoint", NULL, "[pyxis] execute the entrypoint from the container image", 0, 0,
     accept_flag},
    {"no-container-entrypoint", NULL, "[pyxis] do not execute the entrypoint from the container image",
     0, 0, accept_flag},
    SPANK_OPTIONS_TABLE_END
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    for (int i = 0; i < ac; i++) {
        if (strncmp(av[i], "registry_log=", 13) == 0)
            registry_log = av[i] + 13;
    }
    for (struct spank_option *opt = options; opt->name != NULL; opt++) {
        if (spank_option_register(sp, opt) != ESPANK_SUCCESS) {
            slurm_error("pyxis: [ERROR] could not register option --%s", opt->name);
            return -1;
        }
    }
    return 0;
}

static int check_image(const char *path)
{
    char magic[4];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        slurm_error("pyxis: [ERROR] %s: %s", strerror(errno), path);
        return -1;
    }
    ssize_t got = read(fd, magic, sizeof(magic));
    close(fd);
    if (got != (ssize_t) sizeof(magic) || memcmp(magic, "hsqs", sizeof(magic)) != 0) {
        slurm_error("pyxis: [ERROR] Invalid image format: %s (not a squashfs file)", path);
        return -1;
    }
    return 0;
}

static int record_registry_image(spank_t sp, const char *image)
{
    uint32_t job_id = 0, step_id = 0;
    char node[256] = "?", step[16], stamp[32];
    time_t now = time(NULL);

    if (registry_log == NULL) {
        slurm_error("pyxis: [ERROR] fakepyxis.so has no registry_log= argument in plugstack.conf");
        return -1;
    }
    spank_get_item(sp, S_JOB_ID, &job_id);
    spank_get_item(sp, S_JOB_STEPID, &step_id);
    gethostname(node, sizeof(node) - 1);
    if (step_id == SLURM_BATCH_SCRIPT)
        snprintf(step, sizeof(step), "batch");
    else
        snprintf(step, sizeof(step), "%u", step_id);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));

    FILE *log = fopen(registry_log, "a");
    if (log == NULL) {
        slurm_error("pyxis: [ERROR] cannot append to %s: %s", registry_log, strerror(errno));
        return -1;
    }
    fprintf(log, "%s\t%u\t%s\t%s\t%s\n", stamp, job_id, step, node, image);
    if (fclose(log) != 0) {
        slurm_error("pyxis: [ERROR] cannot write %s: %s", registry_log, strerror(errno));
        return -1;
    }
    slurm_spank_log("pyxis: importing docker image: %s", image);
    return 0;
}

static int check_mounts(const char *mounts)
{
    char *list = strdup(mounts), *save = NULL;
    int rc = 0;
    struct stat st;

    if (list == NULL)
        return -1;
    for (char *entry = strtok_r(list, ",", &save); entry != NULL; entry = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(entry, ':');
        if (colon != NULL)
            *colon = '\0';
        if (entry[0] == '/' && stat(entry, &st) != 0) {
            slurm_error("pyxis: [ERROR] %s: %s (container mount source)", strerror(errno), entry);
            rc = -1;
        }
    }
    free(list);
    return rc;
}

static const struct {
    enum value_option option;
    const char *variable;
} exported[] = {
    {OPT_IMAGE, "PYXIS_CONTAINER_IMAGE"},
    {OPT_MOUNTS, "PYXIS_CONTAINER_MOUNTS"},
    {OPT_WORKDIR, "PYXIS_CONTAINER_WORKDIR"},
    {OPT_NAME, "PYXIS_CONTAINER_NAME"},
};

/* Checks run once per step and node; a failure is reported here and fails every task in task_init. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void) ac;
    (void) av;
    if (!spank_remote(sp))
        return 0;
    const char *image = values[OPT_IMAGE];
    if (image != NULL && (image[0] == '/' ? check_image(image) : record_registry_image(sp, image)) != 0)
        step_failed = 1;
    if (values[OPT_MOUNTS] != NULL && check_mounts(values[OPT_MOUNTS]) != 0)
        step_failed = 1;
    for (size_t i = 0; i < sizeof(exported) / sizeof(exported[0]); i++) {
        const char *value = values[exported[i].option];
        if (value != NULL && spank_setenv(sp, exported[i].variable, value, 1) != ESPANK_SUCCESS) {
            slurm_error("pyxis: [ERROR] cannot export %s", exported[i].variable);
            step_failed = 1;
        }
    }
    return 0;
}

/* Like Pyxis, fail in the task: Slurm then ends it with exit code 1, so srun and the job fail. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void) ac;
    (void) av;
    struct stat st;
    const char *workdir = values[OPT_WORKDIR];

    if (!spank_remote(sp))
        return 0;
    if (step_failed) {
        slurm_error("pyxis: couldn't start container");
        return -1;
    }
    if (workdir == NULL || stat(workdir, &st) != 0 || !S_ISDIR(st.st_mode))
        return 0;
    if (chdir(workdir) != 0) {
        slurm_error("pyxis: [ERROR] %s: cannot change to container workdir %s", strerror(errno), workdir);
        return -1;
    }
    return 0;
}

//! The command-line reference: every command and flag of `landfall` and `landfall-gateway`,
//! walked from their `clap::Command`s. Hidden commands and flags are left out, as `--help`
//! leaves them out, and an environment variable is named, never its value here.

use std::fmt::Write;

use clap::{Arg, Command, CommandFactory};

use super::{Page, escape_cell};

/// The index (`cli.md`: both programs, the flags every command takes, `landfall-gateway` whole)
/// and a page for each of `landfall`'s commands (`cli/<command>.md`).
pub fn pages() -> Vec<Page> {
    let landfall = producers::Cli::command();
    let gateway = producers::run::gateway::GatewayCli::command();
    let mut index = String::new();
    writeln!(index, "Every command of the two programs, with every flag. Each also answers `--help`.\n").unwrap();
    writeln!(index, "- [`{0}`](#{0})\n- [`{1}`](#{1})\n", landfall.get_name(), gateway.get_name()).unwrap();
    let mut pages = Vec::new();
    for program in [&landfall, &gateway] {
        let name = program.get_name();
        writeln!(index, "## {name}\n").unwrap();
        command(&mut index, program, name, false);
        // The flags every subcommand takes are said once, at the program.
        let globals: Vec<&Arg> = program.get_arguments().filter(|a| a.is_global_set()).collect();
        if !globals.is_empty() {
            writeln!(index, "Flags every `{name}` command takes:\n").unwrap();
            args_table(&mut index, globals);
        }
        let subs: Vec<&Command> = visible_subcommands(program).collect();
        if program.get_name() == landfall.get_name() {
            // Each command of `landfall` on a page of its own.
            writeln!(index, "Commands:\n").unwrap();
            for sub in subs {
                let path = format!("{name} {}", sub.get_name());
                let file = format!("cli/{}.md", sub.get_name());
                writeln!(index, "- [`{path}`]({file}#{}): {}", anchor(&path), first_line(sub)).unwrap();
                let mut body = String::new();
                walk(&mut body, sub, name, 0);
                pages.push(Page { file, title: path, body });
            }
            writeln!(index).unwrap();
        } else {
            // The gateway's own flags and commands, here.
            let args: Vec<&Arg> = program.get_arguments().filter(|a| !a.is_hide_set() && !a.is_global_set()).collect();
            writeln!(index, "```text\n{}\n```\n", usage(name, &args, program.has_subcommands())).unwrap();
            args_table(&mut index, args);
            for sub in subs {
                walk(&mut index, sub, name, 2);
            }
        }
    }
    pages.insert(0, Page { file: "cli.md".to_string(), title: "Command line".to_string(), body: index });
    pages
}

/// A command's section (a heading `depth` levels below the page's title; none at 0, where the
/// page's title names the command), then its commands'.
fn walk(out: &mut String, cmd: &Command, parent: &str, depth: usize) {
    let path = format!("{parent} {}", cmd.get_name());
    if depth > 0 {
        writeln!(out, "{} {path}\n", "#".repeat(depth + 1)).unwrap();
    }
    command(out, cmd, &path, true);
    let subs: Vec<&Command> = visible_subcommands(cmd).collect();
    if !subs.is_empty() {
        writeln!(out, "Commands:\n").unwrap();
        for sub in &subs {
            let sub_path = format!("{path} {}", sub.get_name());
            writeln!(out, "- [`{sub_path}`](#{}): {}", anchor(&sub_path), first_line(sub)).unwrap();
        }
        writeln!(out).unwrap();
    }
    for sub in subs {
        walk(out, sub, &path, (depth + 1).min(5));
    }
}

fn visible_subcommands(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// The command's description, its usage line, and its own flags and arguments.
fn command(out: &mut String, cmd: &Command, path: &str, with_args: bool) {
    let about = cmd.get_long_about().or(cmd.get_about()).map(|s| s.to_string()).unwrap_or_default();
    if !about.trim().is_empty() {
        writeln!(out, "{}", about.trim()).unwrap();
        writeln!(out).unwrap();
    }
    if let Some(aliases) = Some(cmd.get_visible_aliases().collect::<Vec<_>>()).filter(|a| !a.is_empty()) {
        writeln!(out, "Also: {}.", aliases.iter().map(|a| format!("`{a}`")).collect::<Vec<_>>().join(", ")).unwrap();
        writeln!(out).unwrap();
    }
    if !with_args {
        return;
    }
    let args: Vec<&Arg> = cmd.get_arguments().filter(|a| !a.is_hide_set() && !a.is_global_set()).collect();
    let usage = usage(path, &args, cmd.has_subcommands());
    writeln!(out, "```text\n{usage}\n```").unwrap();
    writeln!(out).unwrap();
    if !args.is_empty() {
        args_table(out, args);
    }
}

/// A usage line built from the arguments (clap's own would name the program by its binary and
/// wrap at the terminal's width).
fn usage(path: &str, args: &[&Arg], subcommands: bool) -> String {
    let mut words = vec![path.to_string()];
    if args.iter().any(|a| !a.is_positional()) {
        words.push("[OPTIONS]".to_string());
    }
    for a in args.iter().filter(|a| a.is_positional()) {
        let name = value_names(a);
        words.push(if a.is_required_set() { name } else { format!("[{name}]") });
    }
    if subcommands {
        words.push("<COMMAND>".to_string());
    }
    words.join(" ")
}

fn value_names(a: &Arg) -> String {
    let names: Vec<String> = match a.get_value_names() {
        Some(v) => v.iter().map(|n| n.to_string()).collect(),
        None => vec![a.get_id().as_str().to_uppercase()],
    };
    let many = a.get_num_args().is_some_and(|n| n.max_values() > 1);
    let joined = names.iter().map(|n| format!("<{n}>")).collect::<Vec<_>>().join(" ");
    if many && names.len() == 1 { format!("{joined}...") } else { joined }
}

fn takes_value(a: &Arg) -> bool {
    a.get_action().takes_values()
}

fn args_table(out: &mut String, args: Vec<&Arg>) {
    writeln!(out, "| argument | what it is |").unwrap();
    writeln!(out, "| --- | --- |").unwrap();
    for a in args {
        let mut name = String::new();
        if a.is_positional() {
            name.push_str(&value_names(a));
        } else {
            let mut forms = Vec::new();
            if let Some(s) = a.get_short() {
                forms.push(format!("-{s}"));
            }
            if let Some(l) = a.get_long() {
                forms.push(format!("--{l}"));
            }
            name.push_str(&forms.join(", "));
            if takes_value(a) {
                name.push(' ');
                name.push_str(&value_names(a));
            }
        }
        let mut what = a.get_long_help().or(a.get_help()).map(|h| h.to_string()).unwrap_or_default();
        what = what.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut notes = Vec::new();
        if a.is_required_set() {
            notes.push("required".to_string());
        }
        let possible: Vec<String> = a
            .get_possible_values()
            .iter()
            .filter(|p| !p.is_hide_set())
            .map(|p| format!("`{}`", p.get_name()))
            .collect();
        if !possible.is_empty() && takes_value(a) {
            notes.push(format!("one of {}", possible.join(", ")));
        }
        let defaults: Vec<String> = a
            .get_default_values()
            .iter()
            .map(|d| match d.to_string_lossy() {
                empty if empty.is_empty() => "`\"\"`".to_string(),
                d => format!("`{d}`"),
            })
            .collect();
        if !defaults.is_empty() && takes_value(a) {
            notes.push(format!("default {}", defaults.join(" ")));
        }
        if let Some(env) = a.get_env() {
            notes.push(format!("env `{}`", env.to_string_lossy()));
        }
        if !notes.is_empty() {
            if !what.is_empty() {
                what.push(' ');
            }
            what.push_str(&format!("({})", notes.join("; ")));
        }
        writeln!(out, "| {} | {} |", escape_cell(&format!("`{name}`")), escape_cell(&what)).unwrap();
    }
    writeln!(out).unwrap();
}

fn first_line(cmd: &Command) -> String {
    let about = cmd.get_about().map(|s| s.to_string()).unwrap_or_default();
    about.split("\n\n").next().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The anchor mdBook gives a heading.
pub fn anchor(heading: &str) -> String {
    super::slug(heading)
}
